"""The rank test ``compare`` judges timed samples with: two-sided Mann-Whitney U, computed once per
rank pattern of the two sample tuples (scipy does the statistics)."""

from __future__ import annotations

from functools import lru_cache
from typing import Optional


def mann_whitney_p(base: tuple, head: tuple) -> float:
    """Two-sided Mann-Whitney U p-value of two sample tuples. The test reads only the samples'
    order and ties, so it is computed once per rank pattern (``rank_pattern``): over a large store
    a few patterns of 3-vs-3 repeats cover thousands of pairs (scipy takes ~6 ms a call)."""
    pattern = rank_pattern(base, head)
    if pattern is None:  # a NaN sample: scipy's own answer for it
        return _mann_whitney_of(tuple(base), tuple(head))
    return _mann_whitney_of(*pattern)


def rank_pattern(base: tuple, head: tuple) -> Optional[tuple[tuple, tuple]]:
    """``base`` and ``head`` with each value replaced by its place among the distinct values of
    both (same order, same ties: the same U statistic and p-value); None where a value is NaN."""
    pooled = (*base, *head)
    if any(v != v for v in pooled):
        return None
    place = {v: i for i, v in enumerate(sorted(set(pooled)))}
    return tuple(place[v] for v in base), tuple(place[v] for v in head)


@lru_cache(maxsize=1 << 16)
def _mann_whitney_of(base: tuple, head: tuple) -> float:
    from scipy.stats import mannwhitneyu  # imported only when a timed change needs the test

    return float(mannwhitneyu(base, head, alternative="two-sided").pvalue)
