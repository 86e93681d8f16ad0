"""Where each SGLang release keeps its serving benchmark, and what its ``--output-file`` line holds.

The serving workload starts SGLang's HTTP server and drives it with SGLang's own serving benchmark.
Its module moved: 0.5.12-0.5.14 implement it in ``sglang/bench_serving.py``; from 0.5.15 the
implementation is ``sglang/benchmark/serving.py`` and ``sglang/bench_serving.py`` is a shim that
re-exports it with a ``FutureWarning``. Both write one JSON object per run to ``--output-file``
(``benchmark()``'s ``result`` dict); the percentile keys grew over the releases (0.5.12-0.5.13 have no
``p90_*`` for TTFT, TPOT and ITL), so ``absent_keys`` names what a release's line lacks.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from specwatch.rules.releases import UnknownReleaseError, _release


class ServingBenchmark(BaseModel):
    """SGLang's serving benchmark in one range of releases."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    first: str
    """First release of the range."""
    last: str
    """Last release of the range."""
    module: str
    """The module ``python -m`` runs (its ``__main__`` parses the benchmark's arguments)."""
    source: str
    """The file under the release's ``sglang/`` that writes the ``--output-file`` line."""
    absent_keys: tuple[str, ...] = ()
    """Keys of ``worker.serving_bench.OUTPUT_KEYS`` the release's line does not write."""


SERVING_BENCHMARKS: tuple[ServingBenchmark, ...] = (
    ServingBenchmark(
        first="0.5.12",
        last="0.5.13",
        module="sglang.bench_serving",
        source="bench_serving.py",
        absent_keys=("p90_ttft_ms", "p95_ttft_ms", "p90_tpot_ms", "p95_tpot_ms", "p90_itl_ms"),
    ),
    ServingBenchmark(first="0.5.14", last="0.5.14", module="sglang.bench_serving", source="bench_serving.py"),
    ServingBenchmark(first="0.5.15", last="0.5.23", module="sglang.benchmark.serving", source="benchmark/serving.py"),
)
"""The serving benchmark of every release range, oldest first (read from each release's source)."""


def serving_benchmark_for(version: str) -> ServingBenchmark:
    """The serving benchmark of ``version``'s range; ``UnknownReleaseError`` outside every range
    (where the benchmark lives in an unknown release is not guessed)."""
    rel = _release(version)
    for b in SERVING_BENCHMARKS:
        if _release(b.first) <= rel <= _release(b.last):
            return b
    raise UnknownReleaseError(
        None,
        f"SGLang {version}: no serving benchmark known for this release ({SERVING_BENCHMARKS[0].first} to "
        f"{SERVING_BENCHMARKS[-1].last}); add its range to specwatch/rules/release_serving.py",
        field="sglang version",
    )
