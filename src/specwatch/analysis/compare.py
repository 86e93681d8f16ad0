"""Per-PR comparison: two result selections -> one verdict per (case, metric), as markdown.

Verdicts: regressed, improved, unchanged, changed (exact metric with no better direction), new,
gone, now failing, now fixed.

* Exact metrics (``Metric.exact``: oracle acceptance, lossless mismatches, memory bytes, leaked
  tokens) and checks: any change in the bad direction is a regression.
* Timed metrics: a change counts only when both hold: the medians differ by more than
  ``threshold`` (relative, default 5%), and a two-sided Mann-Whitney U test on the per-repeat
  samples gives p <= ``alpha``. With 3 repeats per side the smallest p that test can give is 0.1
  (all of one side above all of the other), hence the default ``alpha = 0.1``; use more repeats
  for a stricter alpha. Where both sides ran several engine starts per case (``Metric.engine_medians``),
  the test is Welch's t on the engine medians instead, or a paired t round by round where the two
  records' passes were interleaved in one run (``analysis.engine_test``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from functools import cached_property
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Iterable, Iterator, Optional

from specwatch.analysis.budget_rule import budget_for, budget_key, spread_factor
from specwatch.analysis.engine_test import TimedTest, paired_p, round_ratio, timed_test, welch_p
from specwatch.analysis.noise_class import noise_class
from specwatch.analysis.rank_test import mann_whitney_p
from specwatch.analysis.window_spread import window_spread
from specwatch.core.errors import SpecwatchInputError
from specwatch.core.record import CaseRecord, Metric, Status
from specwatch.store.baseline import OVERHEAD, overhead_by_rounds, overhead_text
from specwatch.store.frame import COMPARE_COLUMN
from specwatch.store.latest import latest_rows
from specwatch.store.select import latest_by_case
from specwatch.store.select_frame import select_rows
from specwatch.store.twins import with_late_speedups

if TYPE_CHECKING:
    import pandas as pd


class Verdict(str, Enum):
    regressed = "regressed"
    now_failing = "now failing"
    gone = "gone"
    changed = "changed"
    improved = "improved"
    now_fixed = "now fixed"
    new = "new"
    unchanged = "unchanged"


BAD = (Verdict.regressed, Verdict.now_failing)


ORDER = {v: i for i, v in enumerate(Verdict)}


@dataclass
class Row:
    """One line of the report."""

    case_id: str
    label: str
    metric: str
    base: Optional[float]
    head: Optional[float]
    unit: str
    verdict: Verdict
    note: str = ""
    timed: bool = False
    """A timing (``is_timing``) that got a test (``test``): per-repeat samples or engine medians on
    both sides. The rows A/A pairs count and floors price."""
    noise_class: str = ""
    """The case's noise class (``noise_class``): where a noise budget applies."""
    speedup: Optional[float] = None
    """The head's speedup over its plain twin (``store.twins``); None: no twin measured."""
    overhead: Optional[str] = None
    """The head's probed / baseline tokens/s with both spreads (``store.baseline``); None: no baseline."""
    test: Optional[TimedTest] = None
    """The test a timed metric's change gets (engine medians or repeats); None: exact, or too few samples."""
    below_floor: bool = False
    """A timed change the test calls (p <= ``BELOW_FLOOR_ALPHA``) but within the threshold or budget that applied:
    real, most likely, yet smaller than the report calls (``unchanged``, listed apart)."""
    spread: Optional[float] = None
    """The wider of the two sides' ``window_spread`` (timed rows): how noisily this pair ran, set
    against the A/A pairs' behind the floor (``analysis.pair_noise``); None: too few samples."""
    noisier: str = ""
    """Set where the pair ran noisier than the floor's A/A pairs (``analysis.pair_noise``): the
    spreads and the change that could hide at this noise; the floor's false-positive rate does not
    cover such a row."""
    round_ratio: Optional[float] = None
    """Passes that took turns (``CaseRecord.paired_turns``): the geometric mean of the rounds' head / base
    engine medians, the change the paired t-test tests and the row's ``ratio``; None: head / base."""

    @property
    def ratio(self) -> Optional[float]:
        if self.round_ratio is not None:
            return self.round_ratio
        if self.base in (None, 0) or self.head is None:
            return None
        return self.head / self.base


BELOW_FLOOR_ALPHA = 0.01
"""p-value a change within its floor must reach to be listed below the floor (``Row.below_floor``):
at compare's alpha 0.1 an A/A pair of 8b timing runs listed 5 of 38 timed metrics by chance."""


TIMING_UNITS = frozenset({"s", "ms", "us", "tokens/s", "requests/s", "x"})
"""Units of a timing: a duration, a rate, or a ratio of rates (``speedup``, ``store.twins``)."""


def is_timing(m) -> bool:
    """Whether a metric (``Metric``-like) is a timing: not exact, a duration or rate, with a better
    direction. Probe time per batch and engine start time are, though they carry engine medians
    only (no repeats). Other non-exact metrics (peak memory, SGLang's step count, a fault's hit
    count: they follow the timed windows) and the oracle's generation time (no direction) get a
    verdict too, but no floor."""
    return not m.exact and m.unit in TIMING_UNITS and m.higher_is_better is not None


def _timed_verdict(
    b: Metric, h: Metric, threshold: float, alpha: float, test: Optional[TimedTest], rel: Optional[float] = None
) -> tuple[Verdict, str, bool]:
    """The verdict and note of a timed change under ``test`` (``timed_test(b, h)``), and whether it
    is below the floor (``Row.below_floor``); ``rel``: the change judged (default head / base - 1)."""
    if rel is None:
        rel = (h.value - b.value) / b.value if b.value else 0.0
    within = f"{rel:+.1%} within {threshold:.0%}"
    if test is None:
        return (
            Verdict.unchanged,
            within if abs(rel) <= threshold else f"{rel:+.1%}, too few samples to tell from noise",
            False,
        )
    if test is TimedTest.paired_rounds:
        p = paired_p(tuple(b.engine_medians), tuple(h.engine_medians))
        on = f" (paired t, {len(h.engine_medians)} interleaved rounds)"
    elif test is TimedTest.engine_medians:
        p = welch_p(tuple(b.engine_medians), tuple(h.engine_medians))
        on = f" (Welch t, {len(b.engine_medians)} vs {len(h.engine_medians)} engine medians)"
    else:
        p, on = mann_whitney_p(tuple(b.samples), tuple(h.samples)), ""
    if abs(rel) <= threshold:
        if rel and p <= min(alpha, BELOW_FLOOR_ALPHA):
            return Verdict.unchanged, f"{rel:+.1%}, p={p:.3f}{on}: below the floor ({threshold:.1%})", True
        return Verdict.unchanged, within, False
    if p > alpha:
        return Verdict.unchanged, f"{rel:+.1%}, p={p:.2f} > {alpha}{on}", False
    if h.higher_is_better is None:  # e.g. the oracle's generation time: a move, not a regression
        return Verdict.changed, f"{rel:+.1%}, p={p:.3f}{on}; no better direction", False
    better = (rel > 0) == h.higher_is_better
    return (Verdict.improved if better else Verdict.regressed), f"{rel:+.1%}, p={p:.3f}{on}", False


def _exact_verdict(b: Metric, h: Metric) -> tuple[Verdict, str]:
    if h.value == b.value:
        return Verdict.unchanged, ""
    if h.higher_is_better is None:
        return Verdict.changed, "exact metric"
    better = (h.value > b.value) == h.higher_is_better
    return (Verdict.improved if better else Verdict.regressed), "exact metric"


SIZING_EXPLAINED = frozenset(
    {"req_to_token_bytes", "req_to_token_row_width", "sglang_alloc_len_per_decode", "model_req_to_token_bytes"}
)
"""Memory metrics whose change the two SGLang versions' own sizing functions can explain."""


def sizing_change(base: CaseRecord, head: CaseRecord) -> str:
    """Why a memory metric moved: the fields of the running SGLang's own sizing (recorded per case
    by the GPU worker) that differ between the two records, or '' when neither recorded it."""
    b, h = (r.details.sglang_sizing or {} for r in (base, head))
    if "error" in b or "error" in h or not b or not h:
        return ""
    moved = [f"{k} {b[k]}→{h[k]}" for k in sorted(set(b) & set(h)) if b[k] != h[k] and b[k] is not None]
    return ("SGLang's sizing: " + ", ".join(moved)) if moved else "SGLang's sizing unchanged: look elsewhere"


def compare_records(
    base: Iterable[CaseRecord],
    head: Iterable[CaseRecord],
    threshold: float = 0.05,
    alpha: float = 0.1,
    budgets: Optional[dict] = None,
) -> list[Row]:
    """One row per (case, metric or check) of the latest record of each case on either side,
    worst verdicts first (``ORDER``), then by case and metric."""
    b_by, h_by = latest_by_case(with_late_speedups(base)), latest_by_case(with_late_speedups(head))
    rows: list[Row] = []
    for cid in sorted(set(b_by) | set(h_by)):
        rows += case_rows(cid, b_by.get(cid), h_by.get(cid), threshold, alpha, budgets)
    rows.sort(key=lambda r: (ORDER[r.verdict], r.case_id, r.metric))
    return rows


def case_rows(
    cid: str,
    b: Optional[CaseRecord],
    h: Optional[CaseRecord],
    threshold: float,
    alpha: float,
    budgets: Optional[dict],
) -> list[Row]:
    """The rows of one case: its status change, then (head ok) every metric and check of the head."""
    label = (h or b).case.label()
    if b is None or h is None:
        verdict = Verdict.new if b is None else Verdict.gone
        return [Row(cid, label, "status", None, None, "", verdict, (h or b).status.value)]
    if b.status is Status.ok and h.status is not Status.ok:
        note = f"{h.status.value}: {(h.reason or '')[:200]}"
        return [Row(cid, label, "status", None, None, "", Verdict.now_failing, note)]
    rows = []
    if b.status is not Status.ok and h.status is Status.ok:
        rows.append(Row(cid, label, "status", None, None, "", Verdict.now_fixed, f"was {b.status.value}"))
    if h.status is not Status.ok:
        return rows
    for name, hm in h.metrics.items():
        bm = b.metrics.get(name)
        if name == OVERHEAD and bm is not None:  # tested round by round where the rounds pair
            bm, hm = overhead_by_rounds(b.metrics, bm), overhead_by_rounds(h.metrics, hm)
        if bm is None:
            rows.append(Row(cid, label, name, None, hm.value, hm.unit, Verdict.new))
        else:
            rows.append(metric_row(cid, label, name, b, h, bm, hm, threshold, alpha, budgets))
    for name, ok in h.checks.items():
        was = b.checks.get(name)
        if was is True and not ok:
            rows.append(Row(cid, label, f"check:{name}", 1, 0, "pass", Verdict.regressed, "check now fails"))
        elif was is False and ok:
            rows.append(Row(cid, label, f"check:{name}", 0, 1, "pass", Verdict.improved, "check now passes"))
    if "speedup" in h.metrics:  # the speedup column (store.twins)
        for r in rows:
            r.speedup = h.metrics["speedup"].value
    if (cell := overhead_text(h.metrics, h.details.baseline)) is not None:  # the overhead column (run --baseline)
        for r in rows:
            r.overhead = cell
    return rows


def metric_row(
    cid: str,
    label: str,
    name: str,
    b: CaseRecord,
    h: CaseRecord,
    bm: Metric,
    hm: Metric,
    threshold: float,
    alpha: float,
    budgets: Optional[dict],
) -> Row:
    """One metric both sides recorded: exact (any change counts) or timed (past its budget and p)."""
    paired = b.interleaved_run is not None and b.interleaved_run == h.interleaved_run
    below, test = False, None if hm.exact else timed_test(bm, hm, paired)
    timed = test is not None and is_timing(hm)
    # paired rounds of one run whose passes also took turns batch by batch (``--paired``)
    turns = test is TimedTest.paired_rounds and b.paired_turns and h.paired_turns
    klass = noise_class(h.case, turns)
    scaled = timed and not turns  # a paired class's floor is its own, not the window spread's
    spread = max((x for x in map(window_spread, (bm, hm)) if x is not None), default=None) if scaled else None
    rounds = round_ratio(tuple(bm.engine_medians), tuple(hm.engine_medians)) if turns else None
    if hm.exact:
        verdict, note = _exact_verdict(bm, hm)
        if verdict is not Verdict.unchanged and name in SIZING_EXPLAINED:
            note = "; ".join(x for x in (note, sizing_change(b, h)) if x)
    else:
        budget = budget_for(budgets, klass, name, threshold, spread)
        verdict, note, below = _timed_verdict(bm, hm, budget, alpha, test, None if rounds is None else rounds - 1.0)
        factor = spread_factor(budgets, klass, name, spread)
        if factor is not None and (verdict is not Verdict.unchanged or below):
            # the budget came from the pair's own noise: say how, next to the verdict
            note = f"{note}; budget {budget:.1%} = {factor:.2f} x window spread {spread:.1%}"
        elif budgets and verdict is not Verdict.unchanged and budget_key(budgets, klass, name) is None:
            # the A/A pairs behind the budgets never measured this class/metric (a new metric, a
            # new model or batch size): the plain threshold applied, say so next to the verdict
            note = f"{note}; no noise budget for {klass}/{name}: {threshold:.0%} threshold"
    return Row(
        cid,
        label,
        name,
        bm.value,
        hm.value,
        hm.unit,
        verdict,
        note,
        timed,
        klass,
        test=test,
        below_floor=below,
        spread=spread,
        round_ratio=rounds,
    )


@dataclass
class MetricView:
    """A metric as ``COMPARE_COLUMN`` keeps it (the fields of ``Metric`` compare reads)."""

    value: float
    unit: str
    samples: list
    exact: bool
    higher_is_better: Optional[bool]
    engine_medians: Optional[list] = None


class RecordView:
    """A records-frame row with its ``COMPARE_COLUMN`` decoded: what ``case_rows`` reads of a record
    (its metrics made only when read: a case on one side only shows its status)."""

    def __init__(self, row: dict):
        import orjson

        cell = orjson.loads(row[COMPARE_COLUMN])
        self._metrics = cell["m"]
        self.status = Status(row["status"])
        self.reason = cell["r"]
        self.checks = cell["c"]
        self.details = SimpleNamespace(sglang_sizing=cell["s"], baseline=cell.get("b"))
        self.interleaved_run = cell.get("i")
        self.paired_turns = bool(cell.get("t"))
        # the frame's model column is the model's name (``store.frame.case_cells``)
        self.case = SimpleNamespace(label=lambda: cell["l"], model_label=row["model"], batch_size=row["batch_size"])

    @cached_property
    def metrics(self) -> dict[str, MetricView]:
        nan = float("nan")
        return {
            name: MetricView(nan if v is None else v, unit, [nan if x is None else x for x in samples], exact, hib, *em)
            for name, (v, unit, samples, exact, hib, *em) in self._metrics.items()
        }


def compare_frames(
    base: "pd.DataFrame",
    head: "pd.DataFrame",
    threshold: float = 0.05,
    alpha: float = 0.1,
    budgets: Optional[dict] = None,
) -> list[Row]:
    """``compare_records`` of two selections as frame rows (``store.select_frame.select_rows``): the
    latest row of each case by the same rule (``latest_rows``), each case's two rows decoded only
    while its rows are made."""
    rows = list(frame_rows(base, head, threshold, alpha, budgets))
    rows.sort(key=lambda r: (ORDER[r.verdict], r.case_id, r.metric))
    return rows


def frame_rows(
    base: "pd.DataFrame",
    head: "pd.DataFrame",
    threshold: float = 0.05,
    alpha: float = 0.1,
    budgets: Optional[dict] = None,
) -> Iterator[Row]:
    """``compare_frames``' rows one case at a time, in case order (unsorted by verdict): a caller
    that keeps only some of them (the release verdict) never holds them all."""
    b_by, h_by = ({} if df.empty else _by_case(latest_rows(df, ["case_id"])) for df in (base, head))
    for cid in sorted(set(b_by) | set(h_by)):
        b, h = (RecordView(side[cid]) if cid in side else None for side in (b_by, h_by))
        yield from case_rows(cid, b, h, threshold, alpha, budgets)


def _by_case(df: "pd.DataFrame") -> dict[str, dict]:
    cols = ["case_id", "status", "model", "batch_size", COMPARE_COLUMN]
    return {r["case_id"]: r for r in df[cols].to_dict("records")}


def compared_sides(
    base: str, head: str, root: Path, columns: Optional[list[str]] = None
) -> tuple["pd.DataFrame", "pd.DataFrame"]:
    """The two selections (``select`` forms) as frame rows (``select_rows``' ``columns``, by default
    the ones a comparison reads); an empty side is refused as ``SpecwatchInputError``."""
    b, h = select_rows(base, root, columns), select_rows(head, root, columns)
    if b.empty or h.empty:
        raise SpecwatchInputError(None, f"empty selection: base has {len(b)} records, head {len(h)}")
    return b, h


def compare_specs(
    base: str, head: str, root: Path, threshold: float = 0.05, alpha: float = 0.1, budgets: Optional[dict] = None
) -> list[Row]:
    """``specwatch compare``: two selections (``compared_sides``) compared."""
    return compare_frames(*compared_sides(base, head, root), threshold, alpha, budgets)
