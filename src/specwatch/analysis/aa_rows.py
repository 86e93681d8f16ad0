"""A/A pairs' timed rows and the held-out judgments the detection floor (``analysis.floor``) is
chosen by: each clean pair's rows judged under what the other pairs alone would set, by class floor
(``held_out_flags``: margin x the others' largest change per class and metric) and by the scaled
rule (``held_out_scaled``: margin x the others' largest change / window spread per metric x the
row's own spread).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from functools import reduce
from typing import Iterable, Optional

from specwatch.analysis.budget_rule import ROUNDING, budget_for
from specwatch.analysis.compare import Row, Verdict, compare_records
from specwatch.analysis.noise import merge_budgets
from specwatch.core.record import CaseRecord


@dataclass(frozen=True)
class AARow:
    """One timed (case, metric) of an A/A pair."""

    key: str
    """``CLASS/METRIC`` (``compare.noise_class`` and the metric's name)."""
    change: float
    """``|head / base - 1|``."""
    testable: bool
    """Whether the Mann-Whitney test lets a change of it count (p <= alpha)."""
    spread: Optional[float] = None
    """The wider of the pair's two ``window_spread`` values: how noisily the A/A runs timed it."""


def aa_rows(base: Iterable[CaseRecord], head: Iterable[CaseRecord], alpha: float = 0.1) -> list[AARow]:
    """Every timed row of an A/A comparison, compared at threshold 0 (so only the test decides)."""
    return timed_rows(compare_records(base, head, threshold=0.0, alpha=alpha))


def timed_rows(rows: Iterable[Row]) -> list[AARow]:
    return [
        AARow(
            f"{r.noise_class}/{r.metric}",
            abs(r.ratio - 1.0),
            r.verdict in (Verdict.regressed, Verdict.improved),
            r.spread,
        )
        for r in rows
        if r.timed and r.ratio is not None
    ]


def largest_changes(rows: list[AARow]) -> dict[str, float]:
    out: dict[str, float] = {}
    for r in rows:
        out[r.key] = max(out.get(r.key, 0.0), r.change)
    return out


def metric_of(key: str) -> str:
    """The metric name of a ``CLASS/METRIC`` key."""
    return key.rsplit("/", 1)[1]


def held_out_flags(
    rows: list[list[AARow]],
    spreads: list[dict[str, float]],
    judged: list[int],
    margin: float,
    threshold: float,
    skip: Optional[set[tuple[int, int]]] = None,
) -> dict[str, int]:
    """Metric name -> rows of the ``judged`` pairs that count (``testable``) and change more than
    the budget the other pairs give their class and metric at ``margin`` (the plain threshold where
    no other pair measured it); the (pair, row) of ``skip`` left out."""
    flagged: Counter[str] = Counter()
    for i in judged:
        others = ({k: max(threshold, margin * v) for k, v in sp.items()} for j, sp in enumerate(spreads) if j != i)
        budgets = reduce(merge_budgets, others, {})
        flagged.update(
            metric_of(r.key)
            for n, r in enumerate(rows[i])
            if (i, n) not in (skip or ())
            and r.testable
            and r.change > budget_for(budgets, *r.key.rsplit("/", 1), threshold)
        )
    return dict(flagged)


def _ratio(r: AARow) -> Optional[float]:
    """A row's change over its window spread; None without a positive spread."""
    return r.change / r.spread if r.spread else None


def top_ratios(rows: list[list[AARow]], pairs: Iterable[int]) -> dict[str, float]:
    """Metric name -> the largest change / spread over the rows of ``pairs``."""
    top: dict[str, float] = {}
    for i in pairs:
        for r in rows[i]:
            if (q := _ratio(r)) is not None:
                top[metric_of(r.key)] = max(top.get(metric_of(r.key), 0.0), q)
    return top


@dataclass(frozen=True)
class Others:
    """What the judged pairs other than one give the scaled rule, for judging that one held out."""

    ratios: dict[str, float]
    """Metric name -> their largest change / spread (``top_ratios``)."""
    measured: frozenset[str] = frozenset()
    """The ``CLASS/METRIC`` keys of their rows: where ``compare`` would set a budget from them."""

    def factor(self, r: AARow) -> Optional[float]:
        """The factor the scaled rule judges ``r`` by, or None where it keeps the class budget, as
        ``compare`` does (``budget_rule.spread_factor``): no spread, no other pair measured its
        class and metric, or no ratio of its metric among the others."""
        return self.ratios.get(metric_of(r.key)) if r.spread and r.key in self.measured else None


def leave_one_out(rows: list[list[AARow]], judged: list[int]) -> dict[int, Others]:
    """Each judged pair -> what the other judged pairs give the scaled rule."""
    out = {}
    for i in judged:
        others = [j for j in judged if j != i]
        out[i] = Others(top_ratios(rows, others), frozenset(r.key for j in others for r in rows[j]))
    return out


def scaled_rows(rows: list[list[AARow]], others: dict[int, Others]) -> set[tuple[int, int]]:
    """(pair, row) of the judged rows the scaled rule judges held out (``Others.factor``)."""
    return {(i, n) for i, o in others.items() for n, r in enumerate(rows[i]) if o.factor(r) is not None}


def held_out_scaled(
    rows: list[list[AARow]], others: dict[int, Others], margin: float, threshold: float
) -> dict[str, int]:
    """Metric name -> rows of the judged pairs (``others``' keys) that count and change more than
    ``margin`` x the other pairs' largest change / spread of that metric x the row's own spread (at
    least ``threshold``); the rows ``Others.factor`` leaves to the class budget are not judged so."""
    flagged: Counter[str] = Counter()
    for i, o in others.items():
        for r in rows[i]:
            k = o.factor(r)
            if k is not None and r.testable and r.change > max(threshold, margin * k * r.spread * (1 + ROUNDING)):
                flagged[metric_of(r.key)] += 1
    return dict(flagged)
