"""SGLang's serving benchmark for one serving case: its command line, and its output as metrics.

The benchmark (``rules.release_serving``: ``sglang.benchmark.serving``, ``sglang.bench_serving``
before 0.5.15) runs as ``python -m MODULE`` against the case's server with:

* ``--dataset-name random-ids --tokenize-prompt``: prompts of random token ids, sent as
  ``input_ids``, exactly ``input_len`` long (``--random-range-ratio 1``). Its ``random`` dataset
  draws the ids from ShareGPT conversations and downloads the ShareGPT file when no
  ``--dataset-path`` is given (``datasets/random.py``, ``sample_random_requests(random_sample=True)``);
  ``random-ids`` draws them from the tokenizer's vocabulary and reads no file. An oracle model
  gets ``--dataset-name random --dataset-path FILE`` instead, a local file of oracle chains
  (``worker.serving_prompts``: random ids would leave half its requests with no timed token);
* ``--max-concurrency batch_size``, every request sent at once (``--request-rate`` left at inf),
  ``serving_requests`` requests, ``output_len`` new tokens each (``ignore_eos``, the default);
* ``--model`` and ``--tokenizer`` the local checkpoint folder (nothing is looked up online);
* ``--output-details``: the line also holds each request's TTFT, inter-token latencies and
  generated text (``request_checks``);
* ``--flush-cache`` after its warm-up requests (``--warmup-requests``: 1 with the suite's warm-up,
  else 0), ``--seed`` the repeat, ``--output-file`` a JSON-lines file in the case's scratch folder.

``parse_output`` turns the line the benchmark appends (its ``result`` dict) into metrics.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path
from typing import Optional

from specwatch.core.case import Case
from specwatch.worker import serving_prompts
from specwatch.worker.measure import MetricSet

OUTPUT_KEYS: dict[str, tuple[str, str, Optional[bool]]] = {
    "ttft_mean": ("mean_ttft_ms", "ms", False),
    "ttft_p50": ("median_ttft_ms", "ms", False),
    "ttft_p90": ("p90_ttft_ms", "ms", False),
    "ttft_p99": ("p99_ttft_ms", "ms", False),
    "tpot_mean": ("mean_tpot_ms", "ms", False),
    "tpot_p50": ("median_tpot_ms", "ms", False),
    "tpot_p90": ("p90_tpot_ms", "ms", False),
    "tpot_p99": ("p99_tpot_ms", "ms", False),
    "itl_mean": ("mean_itl_ms", "ms", False),
    "itl_p50": ("median_itl_ms", "ms", False),
    "itl_p90": ("p90_itl_ms", "ms", False),
    "itl_p99": ("p99_itl_ms", "ms", False),
    "e2e_latency_p50": ("median_e2e_latency_ms", "ms", False),
    "e2e_latency_p90": ("p90_e2e_latency_ms", "ms", False),
    "e2e_latency_p99": ("p99_e2e_latency_ms", "ms", False),
    "output_throughput": ("output_throughput", "tokens/s", True),
    "request_throughput": ("request_throughput", "requests/s", True),
    "completed_requests": ("completed", "requests", True),
    "serving_duration": ("duration", "s", False),
    "peak_concurrent_requests": ("max_concurrent_requests", "requests", None),
    "serving_output_tokens": ("total_output_tokens", "tokens", None),
}
"""Metric name -> (key of the benchmark's ``--output-file`` line, unit, higher is better)."""

ACCEPT_KEY = "accept_length"
"""The line's acceptance: SGLang's ``avg_spec_accept_length`` (``/server_info``'s
``internal_states[0]``) as the benchmark read it after its requests."""

DETAIL_KEYS = (
    "backend",
    "dataset_name",
    "request_rate",
    "max_concurrency",
    "random_input_len",
    "random_output_len",
    "random_range_ratio",
    "completed",
    "total_input_tokens",
    "total_output_tokens",
    "concurrency",
    "max_output_tokens_per_s",
)
"""Keys of the line kept as they are in each repeat's ``details.serving_runs`` entry."""


def bench_argv(
    case: Case,
    module: str,
    port: int,
    model: Path,
    tokenizer: Path,
    output_file: Path,
    seed: int,
    warmup: bool,
    host: str = "127.0.0.1",
    ready_s: int = 60,
    dataset: Optional[Path] = None,
) -> list[str]:
    """``python -m MODULE ...``: one benchmark run of ``case`` (module docstring); ``dataset``: the
    prompts file of ``serving_prompts.write_dataset`` (else random ids)."""
    source = ["random-ids"] if dataset is None else [serving_prompts.DATASET_NAME, "--dataset-path", str(dataset)]
    return [
        sys.executable,
        "-m",
        module,
        "--backend",
        "sglang",
        "--host",
        host,
        "--port",
        str(port),
        "--model",
        str(model),
        "--tokenizer",
        str(tokenizer),
        "--dataset-name",
        *source,
        "--tokenize-prompt",
        "--num-prompts",
        str(case.serving_requests),
        "--random-input-len",
        str(case.input_len),
        "--random-output-len",
        str(case.output_len),
        "--random-range-ratio",
        "1.0",
        "--max-concurrency",
        str(case.batch_size),
        "--warmup-requests",
        "1" if warmup else "0",
        "--flush-cache",
        "--seed",
        str(seed),
        "--disable-tqdm",
        "--ready-check-timeout-sec",
        str(ready_s),
        "--output-file",
        str(output_file),
        "--output-details",
    ]


class BenchOutputError(ValueError):
    """The benchmark's output file holds no result line (it wrote none, or not JSON)."""


def read_output(path: Path) -> dict:
    """The last JSON line of a benchmark's ``--output-file`` (the benchmark appends one per run)."""
    try:
        lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
    except OSError as e:
        raise BenchOutputError(f"no benchmark output at {path.name}: {e.strerror}") from None
    if not lines:
        raise BenchOutputError(f"benchmark output {path.name} is empty")
    try:
        line = json.loads(lines[-1])
    except ValueError as e:
        raise BenchOutputError(f"benchmark output {path.name}: not JSON ({e})") from None
    if not isinstance(line, dict):
        raise BenchOutputError(f"benchmark output {path.name}: not a JSON object")
    return line


def _plain(v):
    """A detail value as JSON writes it: a non-finite number (``request_rate`` inf) as its text."""
    return str(v) if isinstance(v, float) and not math.isfinite(v) else v


def _number(v) -> Optional[float]:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def parse_output(lines: list[dict], case: Case, fallback_accept: Optional[float] = None) -> dict:
    """The benchmark's result lines (one per repeat) -> ``{"metrics", "checks", "details"}``:
    each ``OUTPUT_KEYS`` metric the median over repeats with every repeat as a sample, a key the
    line lacks named in ``details.serving_keys_absent``; acceptance from the line (a speculative
    case whose line has none: ``fallback_accept``, the server's own after the load)."""
    m, absent = MetricSet(), []
    for name, (key, unit, better) in OUTPUT_KEYS.items():
        values = [_number(ln.get(key)) for ln in lines]
        if any(v is None for v in values):
            absent.append(key)
            continue
        m.put(name, statistics.median(values), unit, values, higher_is_better=better)
    checks, details = {}, {}
    completed = [ln.get("completed") for ln in lines]
    checks["all_requests_completed"] = all(c == case.serving_requests for c in completed)
    outs = [ln.get("total_output_tokens") for ln in lines]
    checks["output_tokens_as_requested"] = all(
        o == c * case.output_len for o, c in zip(outs, completed) if isinstance(c, int)
    ) and all(isinstance(o, int) for o in outs)
    if case.algorithm.speculative:
        als = [_number(ln.get(ACCEPT_KEY)) for ln in lines]
        if all(a is not None for a in als):
            m.put("accept_length", statistics.median(als), "tokens/verify", als, higher_is_better=True)
            details["accept_length_source"] = f"benchmark line {ACCEPT_KEY!r} (server avg_spec_accept_length)"
        elif fallback_accept is not None:
            m.put("accept_length", fallback_accept, "tokens/verify", higher_is_better=True)
            details["accept_length_source"] = "/server_info internal_states[0].avg_spec_accept_length after the load"
        else:
            details["accept_length_source"] = None
    checks.update(request_checks(lines, details))
    details["serving_keys_absent"] = absent
    details["serving_runs"] = [{k: _plain(ln.get(k)) for k in DETAIL_KEYS} for ln in lines]
    return {"metrics": m, "checks": checks, "details": details}


def request_checks(lines: list[dict], details: dict) -> dict:
    """Checks on each request of lines written with ``--output-details``: every request that
    completed has a first-token time. The benchmark takes it from the first non-empty text chunk;
    a request whose tokens all stream as empty text keeps TTFT 0 and no inter-token latency, and the
    percentiles then mix in zeros (``serving_prompts``). Counts go to
    ``details.requests_without_first_token_time`` (one per repeat). Lines without details: no check."""
    per_repeat = []
    for ln in lines:
        ttfts, errors = ln.get("ttfts"), ln.get("errors")
        if not isinstance(ttfts, list):
            return {}
        errors = errors if isinstance(errors, list) and len(errors) == len(ttfts) else [""] * len(ttfts)
        per_repeat.append(sum(1 for t, e in zip(ttfts, errors) if not e and not (_number(t) or 0) > 0))
    details["requests_without_first_token_time"] = per_repeat
    return {"first_token_timed_every_request": not any(per_repeat)}
