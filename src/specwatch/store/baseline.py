"""A probed case's baseline (``specwatch run --baseline``) and the harness overhead it gives.

The baseline is a plain loop of ``sglang.Engine.generate`` on the case's timed prompts, in a
process of its own with nothing of specwatch in SGLang's processes (``worker.baseline``), run
interleaved with the probed engine group (``run.baseline``). The case's record then carries:

* ``baseline_output_throughput``: output tokens/s of the plain loop; samples every timed call of
  every baseline run, ``engine_medians`` each run's median where there were several runs, value
  their median (as the probed ``output_throughput`` is over its engine starts);
* ``overhead`` = probed ``output_throughput`` / ``baseline_output_throughput`` (values; 1: the
  harness costs nothing, 0.95: the probed run is 5% slower); its samples are each probed repeat
  over the baseline value, so their relative spread is the probed run's.

``details.baseline`` keeps every run's timings, the order the runs went in, and why a run failed.
"""

from __future__ import annotations

import statistics
from typing import Optional

from specwatch.core.record import CaseRecord, Metric

BASELINE_THROUGHPUT = "baseline_output_throughput"
"""Metric: output tokens/s of the plain-loop baseline (higher is better)."""

OVERHEAD = "overhead"
"""Metric: probed output tokens/s over the baseline's (unit ``x``; 1: no harness cost)."""

PROBED_THROUGHPUT = "output_throughput"
"""The probed record's metric the overhead is the ratio of."""


def relative_spread(values: list[float]) -> Optional[float]:
    """(max - min) / median of ``values``; None with fewer than two or a zero median."""
    if len(values) < 2:
        return None
    med = statistics.median(values)
    return (max(values) - min(values)) / med if med else None


def baseline_metrics(probed: CaseRecord, runs: list[list[float]]) -> dict[str, Metric]:
    """``baseline_output_throughput`` over the baseline runs' per-call tokens/s (``runs``, one list
    per run that timed anything) and ``overhead`` of the probed record over it; empty where no run
    timed anything, and only the baseline where the record has no ``output_throughput``."""
    runs = [r for r in runs if r]
    if not runs:
        return {}
    medians = [statistics.median(r) for r in runs]
    value = statistics.median(medians)
    base = Metric(
        value=value,
        unit="tokens/s",
        samples=[v for r in runs for v in r],
        higher_is_better=True,
        engine_medians=medians if len(runs) > 1 else None,
    )
    out = {BASELINE_THROUGHPUT: base}
    probed_tps = probed.metrics.get(PROBED_THROUGHPUT)
    if probed_tps is not None and value > 0:
        out[OVERHEAD] = Metric(
            value=probed_tps.value / value,
            unit="x",
            samples=[s / value for s in probed_tps.samples],
            higher_is_better=True,
        )
    return out


def overhead_spreads(metrics: dict) -> Optional[tuple[Optional[float], Optional[float]]]:
    """(probed spread, baseline spread) of a record's metrics ((max - min) / median of the probed
    repeats and of the baseline's timed calls; None where one has fewer than two), or None where
    the record has no ``overhead``. ``metrics``: ``Metric`` s or anything with ``samples``."""
    if OVERHEAD not in metrics:
        return None
    base = metrics.get(BASELINE_THROUGHPUT)
    return relative_spread(list(metrics[OVERHEAD].samples)), relative_spread(list(base.samples) if base else [])


def overhead_text(metrics: dict) -> Optional[str]:
    """A report's overhead cell: ``0.982x (spread: probed 1.3%, baseline 0.9%)``, the ratio and the probed and baseline
    spreads (``–`` where unmeasured); None where the record has no ``overhead``."""
    spreads = overhead_spreads(metrics)
    if spreads is None:
        return None
    p, b = ("–" if s is None else f"{s:.1%}" for s in spreads)
    return f"{metrics[OVERHEAD].value:.3f}x (spread: probed {p}, baseline {b})"


def overhead_cells(metrics: dict) -> dict:
    """The records frame's spread columns beside ``overhead`` (none without it)."""
    spreads = overhead_spreads(metrics)
    if spreads is None:
        return {}
    return {"overhead_probed_spread": spreads[0], "overhead_baseline_spread": spreads[1]}
