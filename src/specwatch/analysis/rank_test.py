"""The rank test ``compare`` judges timed samples with: two-sided Mann-Whitney U, computed once per
rank pattern of the two sample tuples.

Where scipy's ``mannwhitneyu`` (``method="auto"``) takes its exact null distribution and both
sides hold at most ``EXACT_MAX`` samples without ties (the 3 to 10 repeats of a timed metric), the
p-value is computed here with scipy's own arithmetic (``exact_p``: the same counts, the same float
divisions and running sum, tested equal to scipy's p bit for bit); every other pattern (ties, NaN,
more samples) is scipy's, imported only then.
"""

from __future__ import annotations

from functools import lru_cache
from math import comb
from typing import Optional

EXACT_MAX = 8
"""Most samples per side ``exact_p`` takes (scipy's ``method="auto"`` is exact up to 8 on either
side; with both at most 8, every count and partial sum of scipy's stays an integer a float holds)."""


def mann_whitney_p(base: tuple, head: tuple) -> float:
    """Two-sided Mann-Whitney U p-value of two sample tuples. The test reads only the samples'
    order and ties, so it is computed once per rank pattern (``rank_pattern``): over a large store
    a few patterns of 3-vs-3 repeats cover thousands of pairs."""
    pattern = rank_pattern(base, head)
    if pattern is None:  # a NaN sample: scipy's own answer for it
        return _scipy_p(tuple(base), tuple(head))
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
    """The p-value of one rank pattern: ``exact_p`` where it applies, else scipy's."""
    p = exact_p(base, head)
    return _scipy_p(base, head) if p is None else p


def exact_p(base: tuple, head: tuple) -> Optional[float]:
    """scipy's exact two-sided p-value of two samples without ties (``_mannwhitneyu._MWU``): the
    number of orderings giving each U (integers), each over ``comb(n1 + n2, n1)`` as a float,
    summed from U = 0 in order up to the smaller of U1 and U2, doubled and clipped to 1. None where
    a side is empty or holds more than ``EXACT_MAX`` samples, or a value ties."""
    n1, n2 = len(base), len(head)
    pooled = (*base, *head)
    if not 0 < n1 <= EXACT_MAX or not 0 < n2 <= EXACT_MAX or len(set(pooled)) < len(pooled):
        return None
    small, large = min(n1, n2), max(n1, n2)
    u1 = sum(1 for x in base for y in head if x > y)  # R1 - n1 (n1 + 1) / 2, without ties
    k = min(u1, n1 * n2 - u1)  # sf(max(U1, U2)) = cdf(n1 n2 - max) by symmetry
    total = float(comb(small + large, small))
    cdf = 0.0
    for count in _u_counts(small, large)[: k + 1]:
        cdf += count / total
    return min(max(cdf * 2, 0.0), 1.0)


@lru_cache(maxsize=256)
def _u_counts(m: int, n: int) -> tuple[int, ...]:
    """How many of the ``comb(m + n, m)`` orderings of m and n samples give each U (0 .. m n)."""
    # counts[j][u]: orderings of j first-side and i second-side samples with U = u, row by row over i
    counts = [[1] + [0] * (m * n) for _ in range(m + 1)]  # i = 0: U = 0 only
    for i in range(1, n + 1):
        nxt = [[1] + [0] * (m * n)]
        for j in range(1, m + 1):
            # the largest sample is the first side's (beats all i others: U + i) or the second's
            row = [counts[j][u] + (nxt[j - 1][u - i] if u >= i else 0) for u in range(m * n + 1)]
            nxt.append(row)
        counts = nxt
    return tuple(counts[m])


@lru_cache(maxsize=1 << 16)
def _scipy_p(base: tuple, head: tuple) -> float:
    from scipy.stats import mannwhitneyu  # imported only when a pattern needs it

    return float(mannwhitneyu(base, head, alternative="two-sided").pvalue)
