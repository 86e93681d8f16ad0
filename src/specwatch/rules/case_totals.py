"""Exact metrics that count over every batch of a case, and the engine-agreement check judged without them.

``decode_unaligned_batches`` and ``retracted_requests`` are totals over the whole case (warm-up,
untimed and timed batches). With timed windows (``[suite] min_timed_s``) the number of timed
batches is the timing's, so those totals differ between engine starts of one case while every
per-batch exact metric agrees: the 0.5.17 timing records of plain decoding at page 64 counted
15748 / 13970 / 15748 unaligned decode batches on their three engines
(``73121e70676f@20261202T061554Z``). The worker records them as not exact where windows ran;
records made before that failed ``exact_metrics_agree_across_engines`` on them alone.
"""

from __future__ import annotations

from typing import Optional

CASE_TOTALS = ("decode_unaligned_batches", "retracted_requests")
"""Metric names of counts over every batch of the case."""

AGREE_CHECK = "exact_metrics_agree_across_engines"
"""The merged record's check that every exact metric took one value on every engine start."""


def engines_agree_now(checks: dict, metrics: dict, windowed: bool) -> Optional[bool]:
    """``AGREE_CHECK`` judged again: for a record timed in windows, whether every exact metric but
    the ``CASE_TOTALS`` took one value on every engine (None: the record has no such check, or
    ran without windows, where its verdict stands)."""
    if AGREE_CHECK not in checks or not windowed:
        return None
    for name, m in metrics.items():
        medians = getattr(m, "engine_medians", None)
        if name in CASE_TOTALS or not getattr(m, "exact", False) or not medians:
            continue
        if len(set(medians)) > 1:
            return False
    return True
