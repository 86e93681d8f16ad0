"""Helpers that build records for harness tests."""

import itertools
import statistics
from datetime import datetime, timezone
from typing import Optional

from specwatch.core.case import Algorithm, Backend, Case, ModelSize
from specwatch.core.record import CaseRecord, Metric, Provenance, Status
from specwatch.rules.memory_model import ModelAlgorithm

T0 = datetime(2026, 11, 30, tzinfo=timezone.utc)


def case(**kw) -> Case:
    base = dict(
        model=ModelSize.tiny,
        algorithm=Algorithm.EAGLE,
        attention_backend=Backend.triton,
        page_size=64,
        topk=4,
        num_steps=3,
        num_draft_tokens=8,
        batch_size=1,
        input_len=128,
        output_len=256,
    )
    base.update(kw)
    return Case(**base)


def prov(**kw) -> Provenance:
    base = dict(
        specwatch_version="0.1.0",
        hostname="h",
        machine="m",
        python_version="3.12",
        sglang_version="0.5.17",
        started_at=T0,
        finished_at=T0,
    )
    base.update(kw)
    return Provenance(**base)


def record(c: Case = None, status=Status.ok, reason=None, tps=100.0, **kw) -> CaseRecord:
    c = c or case()
    metrics = (
        {"output_throughput": Metric(value=tps, unit="tokens/s", samples=[tps], higher_is_better=True)}
        if status is Status.ok
        else {}
    )
    return CaseRecord(
        suite="smoke", case_id=c.case_id, case=c, status=status, reason=reason, metrics=metrics, provenance=prov(**kw)
    )


def rounds_record(
    c: Case,
    probed: list[list[float]],
    plain: Optional[list[list[float]]] = None,
    run: str = "r1",
    *,
    engines: Optional[list[dict]] = None,
    runs: Optional[list[dict]] = None,
    cached: Optional[list[int]] = None,
    paired: bool = True,
) -> CaseRecord:
    """A timing record over engine starts, as ``specwatch run --baseline`` merges one: start k timed
    the repeats ``probed[k]``, and where ``plain`` is given, plain-loop run k (round k) timed the
    calls ``plain[k]``, with the baseline metrics over them. ``engines`` / ``runs``: more fields of
    each start / run; ``cached``: per run, the prompt tokens each of its calls took from the radix
    cache (default none); ``paired``: the rounds ran paired (``paired0 ...``), else sequential."""
    from specwatch.store.baseline import baseline_metrics  # the store, only where a test builds rounds

    rec = record(c, tps=100.0, run_id=run)
    rec.suite = "timing"
    tps = rec.metrics["output_throughput"]
    tps.samples = [x for xs in probed for x in xs]
    tps.engine_medians = [statistics.median(xs) for xs in probed]
    more = engines or [{}] * len(probed)
    rec.details.engine_starts = {
        "planned": len(probed),
        "ran": len(probed),
        "engines": [
            {"started_at": "t", "timed_windows": {"repeats": len(xs)}} | more[k] for k, xs in enumerate(probed)
        ],
    }
    if plain is None:
        return rec
    more, cached = runs or [{}] * len(plain), cached or [0] * len(plain)
    rec.details.baseline = {
        "order": [f"paired{k}" for k in range(len(plain))] if paired else [],
        "runs": [
            {"round": k, "output_throughput": xs, "cached_tokens": [cached[k]] * len(xs)} | more[k]
            for k, xs in enumerate(plain)
        ],
    }
    rec.metrics.update(baseline_metrics(rec, plain))
    return rec


SIZING_GRID = list(
    itertools.product(
        [None, ModelAlgorithm.EAGLE, ModelAlgorithm.EAGLE3, ModelAlgorithm.STANDALONE, ModelAlgorithm.NGRAM],
        [1, 16, 64, 256],  # page
        [1, 2, 4, 8],  # topk
        [1, 3, 5],  # steps
        [4, 16],  # draft tokens
        [2048, 131072],  # context
        [1, 2],  # dcp
    )
)
"""The 1,920 (algorithm, page, topk, steps, draft tokens, context, dcp) sizing configurations the
memory model is checked on against SGLang's own sizing (installed and per cached release)."""
