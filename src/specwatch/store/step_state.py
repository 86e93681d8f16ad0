"""The host's slow state in a record: the share of SGLang's decode steps that ran slow.

Each timed window that read SGLang's own step times keeps their distribution
(``worker.step_times.distribution``), with ``slow_share``: the steps longer than 1.25x the
window's 10th percentile. A tiny oracle's decode step is bound by the scheduler's Python, and on a
host whose vCPUs switch between a fast and a slow state that share, not the code, sets most of a
window's throughput. On one H100 host, tiny batch 8 in ``20261207T015215Z-fa7a14``: the three
probed engines ran 6%, 75% and 41% of their steps slow and read 7,763, 4,426 and 6,289 output
tokens/s; the plain loops of the same rounds ran 51%, 9% and 21% slow and read 5,123, 9,935 and
8,798; so each round's overhead (1.52, 0.45, 0.72) swung with the host.

A probed record keeps one share per engine start (``details.engine_starts.engines[]``, or its one
window's where it ran one engine), a record with a baseline one per plain-loop run
(``details.baseline.runs[]``).
"""

from __future__ import annotations

import statistics
from typing import Optional

SLOW_SHARE = "slow_share"
"""The distribution's key for the share of slow steps (``worker.step_times.distribution``)."""

LOOPS = ("probed", "plain")
"""The two loops a window belongs to: a probed engine start, a plain-loop run (``run --baseline``)."""


def shares_column(loop: str) -> str:
    """The records frame's column of a record's slow-step shares of ``loop`` (``LOOPS``), one per window."""
    return f"slow_steps_{loop}"


def tps_column(loop: str) -> str:
    """The records frame's column of the output tokens/s beside each share of ``shares_column(loop)``."""
    return f"slow_tps_{loop}"


def _share(dist: Optional[dict]) -> Optional[float]:
    value = (dist or {}).get(SLOW_SHARE)
    return float(value) if isinstance(value, (int, float)) else None


def probed_windows(details, throughput=None) -> tuple[list[float], list[Optional[float]]]:
    """The slow-step share of each probed engine start of a record's ``details`` that recorded one
    (a single-start record: its window's), and beside each its output tokens/s from
    ``throughput`` (the record's ``output_throughput`` metric: its ``engine_medians``, or its value
    for one start; None where they do not line up with the starts)."""
    engines = (getattr(details, "engine_starts", None) or {}).get("engines")
    if engines:
        shares = [_share(e.get("sglang_step_distribution")) for e in engines]
    else:
        shares = [_share((getattr(details, "sglang_step_times", None) or {}).get("distribution_ms"))]
    medians = list(getattr(throughput, "engine_medians", None) or [])
    if not medians and throughput is not None and len(shares) == 1:
        medians = [throughput.value]
    tps = medians if len(medians) == len(shares) else [None] * len(shares)
    kept = [(s, t) for s, t in zip(shares, tps) if s is not None]
    return [s for s, _ in kept], [t for _, t in kept]


def probed_slow_shares(details) -> list[float]:
    """The slow-step share of each probed engine start of a record's ``details`` that recorded one
    (a single-start record: its window's); empty where none did."""
    return probed_windows(details)[0]


def plain_windows(baseline: Optional[dict]) -> tuple[list[float], list[Optional[float]]]:
    """The slow-step share of each plain-loop run of a record's ``details.baseline`` that recorded
    one, and beside each the median output tokens/s of its timed calls (None without them)."""
    shares, tps = [], []
    for run in (baseline or {}).get("runs") or []:
        share = _share(run.get("sglang_step_distribution"))
        if share is not None:
            timed = run.get("output_throughput") or []
            shares.append(share)
            tps.append(float(statistics.median(timed)) if timed else None)
    return shares, tps


def shares_text(shares: list[float]) -> str:
    """``41% (6-75%, 3 windows)``: the median share with the range and count; ``not recorded`` for none."""
    if not shares:
        return "not recorded"
    med = statistics.median(shares)
    if len(shares) == 1:
        return f"{med:.0%} (1 window)"
    return f"{med:.0%} ({100 * min(shares):.0f}-{max(shares):.0%}, {len(shares)} windows)"
