"""A comparison with a planted slowdown on one side: whether its decode metrics could call it.

A ``slow-verify-*`` fault (``inject.stalls``) adds a known cost to every EAGLE verify step. Set
against the clean side's step time of the same case, that cost is the change the report should
find; each decode metric's row then either exceeds the budget it was judged by (the detection floor
at the row's window spread, ``DetectionFloor.budget_at``) and is ``called`` or ``missed``, or does
not and is ``below the floor`` (the report cannot count on calling it there), unless its verdict
calls it anyway: a row whose verdict calls the slowdown reads ``called``.

The share is the planted microseconds over the clean side's step of the same metric where the
metric is a step time, else over its ``sglang_step_time_p10`` (or ``step_time`` without it): the
fast-state step a throughput change is made of. On tiny batch 16 on an H100 host
(``8fa79f993a7d`` in run ``20261207T020257Z-a11a41``) 150 µs of GPU time is 4.9% of the clean
pass's 3.09 ms fast step, below its 5.1% ``sglang_step_time_p10`` floor and its 68%
``output_throughput`` floor.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Iterable, Optional

import pandas as pd

from specwatch.analysis.compare import Row, Verdict
from specwatch.analysis.floor import DetectionFloor
from specwatch.inject.stalls import SLOW_VERIFY_GPU_US, SLOW_VERIFY_US

PLANTED_METRICS = ("sglang_step_time_p10", "sglang_step_time", "step_time", "decode_throughput", "output_throughput")
"""The decode metrics a planted verify-step cost moves, in the order the report lists them."""

STEP_METRICS = ("sglang_step_time_p10", "sglang_step_time", "step_time")
"""Metrics that are a step time: the planted cost's share is over their own clean value."""

REFERENCE_STEPS = ("sglang_step_time_p10", "step_time")
"""The clean step a throughput metric's share is over, the first the case has."""


@dataclass(frozen=True)
class Planted:
    """The planted slowdown of one side of a comparison."""

    fault: str
    micros: int
    kind: str
    """``host time`` (the scheduler spins) or ``GPU time`` (queued on the verify step's stream)."""
    side: str
    """``head`` or ``base``: the side that ran it."""

    @property
    def expected(self) -> Verdict:
        """The verdict that calls it: the head slower, or the base slower (head improved)."""
        return Verdict.regressed if self.side == "head" else Verdict.improved


class Reading(str, Enum):
    """What one decode metric row made of the planted slowdown."""

    called = "called"
    """The row's verdict is the one that calls the slowdown (its measured change beat the budget,
    also where the planted share alone is within it)."""
    missed = "missed"
    """The share exceeded the row's budget, yet the row's verdict does not call it."""
    below_floor = "below the floor"
    """The share is within the row's budget and the verdict does not call it: the report could not."""


@dataclass(frozen=True)
class PlantedRow:
    """One decode metric row of a comparison, read against the planted slowdown."""

    row: Row
    """The comparison's row (case, metric, verdict)."""
    share: float
    """The planted cost over ``clean_step_ms``."""
    clean_step_ms: float
    """The clean side's step the share is over (milliseconds)."""
    step_metric: str
    """The metric that step is (the row's own, or the case's ``REFERENCE_STEPS`` one)."""
    budget: float
    """The budget the row was judged by (``DetectionFloor.budget_at``)."""
    reading: Reading
    """Called, missed, or below the floor."""


def planted_of(fault: Optional[str], side: str) -> Optional[Planted]:
    """The planted slowdown ``fault`` names (None: no fault, another fault, or a null one)."""
    if fault in SLOW_VERIFY_US and SLOW_VERIFY_US[fault] > 0:
        return Planted(fault, SLOW_VERIFY_US[fault], "host time", side)
    if fault in SLOW_VERIFY_GPU_US and SLOW_VERIFY_GPU_US[fault] > 0:
        return Planted(fault, SLOW_VERIFY_GPU_US[fault], "GPU time", side)
    return None


def side_fault(rows: pd.DataFrame) -> Optional[str]:
    """The one fault a side's frame rows ran under (None: clean, or several)."""
    faults = set(rows.fault.dropna()) if "fault" in rows and not rows.empty else set()
    return faults.pop() if len(faults) == 1 else None


def _clean(r: Row, planted: Planted) -> Optional[float]:
    return r.base if planted.side == "head" else r.head


def planted_table(rows: Iterable[Row], floor: DetectionFloor, planted: Planted) -> list[PlantedRow]:
    """Per case and decode metric (``PLANTED_METRICS``, timed rows only): the planted share of the
    clean step, the budget the row was judged by, the verdict and whether that calls the slowdown."""
    by_case: dict[str, dict[str, Row]] = {}
    for r in rows:
        if r.timed and r.metric in PLANTED_METRICS:
            by_case.setdefault(r.case_id, {})[r.metric] = r
    out = []
    for cid in sorted(by_case):
        metrics = by_case[cid]
        ref = next((metrics[m] for m in REFERENCE_STEPS if m in metrics and _clean(metrics[m], planted)), None)
        for m in PLANTED_METRICS:
            r = metrics.get(m)
            step = r if m in STEP_METRICS else ref
            clean = _clean(step, planted) if step is not None else None
            if r is None or not clean:
                continue
            share = planted.micros / 1000 / clean
            budget = floor.budget_at(r.noise_class, r.metric, r.spread)
            if r.verdict is planted.expected:
                reading = Reading.called
            else:
                reading = Reading.below_floor if share <= budget else Reading.missed
            out.append(PlantedRow(r, share, clean, step.metric, budget, reading))
    return out


def planted_lines(
    rows: list[Row], floor: DetectionFloor, base_fault: Optional[str], head_fault: Optional[str]
) -> list[str]:
    """The report's planted-slowdown section (``planted_table`` as markdown), nothing where neither
    side ran a planted slowdown with time added."""
    planted = planted_of(head_fault, "head") or planted_of(base_fault, "base")
    if planted is None:
        return []
    table = planted_table(rows, floor, planted)
    if not table:
        return []
    counts = {k: sum(t.reading is k for t in table) for k in Reading}
    hidden = (
        " Host time can cost nothing where the GPU bounds the step: SGLang's overlap scheduler runs the host ahead."
        if planted.kind == "host time" and counts[Reading.missed]
        else ""
    )
    lines = [
        f"Planted slowdown `{planted.fault}` in {planted.side}: {planted.micros} µs of {planted.kind} per verify "
        f"step. Of {len(table)} decode metric rows, {counts[Reading.called]} called it, {counts[Reading.missed]} missed it above "
        f"their budget, {counts[Reading.below_floor]} could not (the planted share of the clean step within the budget "
        f"the row was judged by, and not called: below the floor).{hidden}",
        "",
        "| case | metric | planted share of the clean step | budget | verdict | reading |",
        "|---|---|---|---|---|---|",
    ]
    for t in table:
        r = t.row
        lines.append(
            f"| `{r.case_id}` {r.label} | {r.metric} | {t.share:.1%} of {t.clean_step_ms:.3g} ms "
            f"({t.step_metric}) | {t.budget:.1%} | {r.verdict.value} | {t.reading.value} |"
        )
    return [*lines, ""]
