"""Which test a timed metric's change gets: on engine medians where both sides ran several engines, else on repeats.

Repeats of one engine are not independent samples of the case: at batch 1 on an H200 the same case
spread 639-970 tok/s over three engine starts while each engine's own repeats stayed within ~5%.
A test on pooled repeats then reads one lucky engine as a significant change. Where both sides
carry ``Metric.engine_medians`` from at least ``MIN_ENGINES`` engine starts, the unit is the
engine: Welch's t-test on the engine medians (unequal variances). With few engines a rank test
cannot reject: the exact two-sided Mann-Whitney U gives at best p = 1/3 for 2 vs 2 engines and
0.1 for 3 vs 3, so a 2-engine comparison could never flag anything. The t-test can, and its false
positive rate stays at ``alpha`` as long as engine medians are roughly normal (each is a median of
several repeats); its power with 2-3 engines is low, which is the honest answer. Otherwise the
per-repeat samples get the two-sided Mann-Whitney U test as before.
"""

from __future__ import annotations

import math
from enum import Enum
from functools import lru_cache
from typing import Optional

MIN_ENGINES = 2
"""Engine starts each side needs before its engine medians are tested."""


class TimedTest(str, Enum):
    """The test behind a timed metric's verdict."""

    repeats = "repeats"
    """Two-sided Mann-Whitney U on the per-repeat samples."""
    engine_medians = "engine_medians"
    """Welch's t-test on the per-engine medians (both sides with at least ``MIN_ENGINES``)."""


def timed_test(b, h) -> Optional[TimedTest]:
    """The test two metrics (``Metric``-like) get; None: too few samples for either."""
    if len(getattr(b, "engine_medians", None) or []) >= MIN_ENGINES and (
        len(getattr(h, "engine_medians", None) or []) >= MIN_ENGINES
    ):
        return TimedTest.engine_medians
    if len(b.samples) >= 2 and len(h.samples) >= 2:
        return TimedTest.repeats
    return None


@lru_cache(maxsize=1 << 14)
def welch_p(base: tuple, head: tuple) -> float:
    """Two-sided Welch t-test p-value; 1.0 where it is undefined (both sides without spread and
    equal means), 0.0 where both lack spread and the means differ."""
    from scipy.stats import ttest_ind

    p = float(ttest_ind(base, head, equal_var=False).pvalue)
    if math.isnan(p):
        return 1.0 if sum(base) / len(base) == sum(head) / len(head) else 0.0
    return p
