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

Where both records come from one run whose passes alternated engine start by engine start
(``run.interleave``: the same ``CaseRecord.interleaved_run``, as many engines on each side), engine
``k`` of one side ran right beside engine ``k`` of the other, so the engines pair up: a paired
t-test on the log ratios of the paired engine medians (``paired_p``). A drift of the host shared
by a pair cancels in its ratio, which Welch's test on unpaired medians counts as noise: three
rounds whose ratios agree within 1% give p below 0.01 where Welch's test on the same medians can
stay above 0.1.
"""

from __future__ import annotations

import math
import statistics
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
    paired_rounds = "paired_rounds"
    """Paired t-test on the log ratios of engine medians paired round by round (interleaved passes)."""


def timed_test(b, h, paired: bool = False) -> Optional[TimedTest]:
    """The test two metrics (``Metric``-like) get; None: too few samples for either. ``paired``:
    the two records' engines ran interleaved round by round (``CaseRecord.interleaved_run`` equal)."""
    be, he = getattr(b, "engine_medians", None) or [], getattr(h, "engine_medians", None) or []
    if len(be) >= MIN_ENGINES and len(he) >= MIN_ENGINES:
        if paired and len(be) == len(he) and all(v > 0 for v in (*be, *he)):
            return TimedTest.paired_rounds
        return TimedTest.engine_medians
    if len(b.samples) >= 2 and len(h.samples) >= 2:
        return TimedTest.repeats
    return None


@lru_cache(maxsize=1 << 14)
def welch_p(base: tuple, head: tuple) -> float:
    """Two-sided Welch t-test p-value; 1.0 where it is undefined (both sides without spread and
    equal means), 0.0 where both lack spread and the means differ. Where one side has no spread
    (three engines at the same count), Welch's statistic is the other side's one-sample t against
    it, with that side's n - 1 degrees of freedom: computed so, since scipy warns of precision
    loss on a side of equal values."""
    from scipy.stats import t, ttest_ind

    flat_b, flat_h = max(base) == min(base), max(head) == min(head)
    if flat_b and flat_h:  # undefined: scipy would warn and give nan
        return 1.0 if base[0] == head[0] else 0.0
    if flat_b or flat_h:
        flat, other = (base, head) if flat_b else (head, base)
        n = len(other)
        se = statistics.stdev(other) / math.sqrt(n)
        return float(2 * t.sf(abs(statistics.fmean(other) - flat[0]) / se, n - 1))
    p = float(ttest_ind(base, head, equal_var=False).pvalue)
    if math.isnan(p):
        return 1.0 if sum(base) / len(base) == sum(head) / len(head) else 0.0
    return p


@lru_cache(maxsize=1 << 14)
def paired_p(base: tuple, head: tuple) -> float:
    """Two-sided paired t-test p-value on ``log(head[k] / base[k])`` (positive values, equal
    lengths); 1.0 where every ratio is 1, 0.0 where the ratios are equal and not 1."""
    from scipy.stats import ttest_1samp

    logs = [math.log(h / b) for b, h in zip(base, head)]
    if max(logs) - min(logs) < 1e-12:
        return 1.0 if abs(logs[0]) < 1e-12 else 0.0
    return float(ttest_1samp(logs, 0.0).pvalue)


def round_ratio(base: tuple, head: tuple) -> float:
    """The change ``paired_p`` tests, as a ratio: the geometric mean of ``head[k] / base[k]``
    (positive values, equal lengths)."""
    return math.exp(statistics.fmean(math.log(h / b) for b, h in zip(base, head)))
