"""How noisily one record timed a metric: the spread of its timed windows (or repeats).

A run's own spread tells a quiet host from a noisy one before any comparison is made. It is the
interdecile range over the median, not the ``(max - min) / median`` the records frame keeps
(``store.baseline.relative_spread``): a range grows with the number of samples, and records of
one class carry 9 to 36 windows. Over the stored timing records (decode throughput, every window
of every engine start) the tiny batch-8 A/A runs of one H100 host read 0.033-0.051 (run
``20261206T021311Z-d11376``), the run of a noisier host of the same kind 0.454 on the same case
and suite (``bf707c02b1ca@20261206T060926Z``), and 8b 0.002-0.012 on the H200.
"""

from __future__ import annotations

from typing import Optional

SPREAD_SAMPLES = 4
"""Timed samples (windows or repeats) a side needs for its ``window_spread``."""


def window_spread(m) -> Optional[float]:
    """A timed metric's noise within one record: ``(p90 - p10) / |median|`` of its samples (every
    window or repeat of every engine start); None with fewer than ``SPREAD_SAMPLES`` finite ones or
    a zero median."""
    import numpy as np

    xs = np.asarray([x for x in (m.samples or []) if x == x], dtype=float)
    if len(xs) < SPREAD_SAMPLES or not (med := float(np.median(xs))):
        return None
    p10, p90 = np.quantile(xs, [0.1, 0.9])
    return float((p90 - p10) / abs(med))
