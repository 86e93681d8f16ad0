"""The detection floor: per noise class and timed metric, the smallest relative change ``compare``
calls a regression while A/A pairs (two runs of the same code) stay at most 1% flagged, held out.

From the A/A pairs of a noise-budget file (``analysis.noise.BudgetFile``, the store's
``noise-budgets.json`` by default): each pair's timed rows are compared once at threshold 0
(``aa_rows``), which keeps for every (case, metric) its relative change and whether the
Mann-Whitney test would let it count (p <= alpha). Budgets are ``margin`` x a pair's largest change
per class and metric, at least ``threshold`` (``NoiseReport.budgets``). For each margin of
``MARGINS``, each clean pair is judged under the budgets of the other pairs only (leave one out).

The margin is chosen per metric name, pooled over the noise classes (``tiny/bs8/decode_throughput``
and ``8b/bs1/decode_throughput`` share ``decode_throughput``'s): the smallest margin at which none
of that metric's rows of the clean pairs is flagged held out, ``MARGINS[-1]`` where none is that
small. A metric that moves 30-42% between 8b A/A runs (probe time per batch) so takes its own
margin and leaves a 1-3% metric's floor at its own. Zero flags, not a rate, is the per-metric rule:
a metric has few rows over the pairs (one per pair, class and case: 9 in the timing suite's six
pairs), where one flag is a rate near 10% and a 1% rate cannot be told from zero. ``GOAL`` is
checked where it can be resolved: over every timed row of the clean pairs at the chosen margins
(``held_out_rate``), which is above zero only through a metric that still flags at the largest
margin. That rate is measured on the same flags the margins were chosen from, so it is a lower
bound on the rate of pairs not yet measured, not an independent estimate of it.

The floor of a class and metric is its metric's margin x its largest A/A change over all pairs, at
least ``threshold``. A metric no clean pair measured takes the largest margin chosen, its rate
unmeasured; a class and metric no pair measured has the plain threshold, its rate unmeasured.

**Scaled to the pair's noise.** That floor is the noise of the hosts its A/A pairs ran on: one
noisy pair sets it for every later comparison of its class, however quiet their host. Each timed
row also carries its pair's window spread (``AARow.spread``, the interdecile range of every timed
window over the median), and an A/A change stays within a fraction of it. So per metric name,
pooled over the classes, ``per_spread`` is a margin x the largest change / spread of the clean
pairs' rows (the margin again the smallest with no row flagged held out), and a compared row with a
window spread, of a class and metric some pair measured, gets the budget ``per_spread x its
spread`` instead of its class floor (``budget_at``; ``compare_budgets``), at least the threshold
the pairs were judged at. A row without a spread (too few windows, engine medians only, a paired
class) keeps the class floor, a class no pair measured the plain threshold; ``held_out_rate`` is
over the rule as applied (docs/metrics.md, detection floor)."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import reduce
from pathlib import Path
from typing import Iterable, Optional

import pandas as pd

from specwatch.analysis.aa_rows import (
    AARow,
    aa_rows,
    held_out_flags,
    held_out_scaled,
    largest_changes,
    leave_one_out,
    metric_of,
    scaled_rows,
    timed_rows,
    top_ratios,
)
from specwatch.analysis.budget_rule import SPREAD_KEY, budget_for, spread_factor
from specwatch.analysis.compare import frame_rows
from specwatch.analysis.noise import BudgetFile, aa_differences, condition_differences, merge_budgets
from specwatch.analysis.noise_class import PAIRED_SUFFIX
from specwatch.core.record import CaseRecord

__all__ = ["AARow", "DetectionFloor", "aa_rows", "detection_floor", "floor_of", "store_floor", "store_floors"]

MARGINS: tuple[float, ...] = (1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 6.0, 10.0)
"""Margins tried, smallest first (budget = margin x the largest A/A change)."""

GOAL = 0.01
"""Held-out false-positive rate the floor keeps to (flagged / timed metrics of the clean A/A pairs)."""

BUDGET_FILE = "noise-budgets.json"
"""The A/A pairs' file under the results root that ``store_floor`` reads unless told another."""

SUITE_BUDGET_FILE = "noise-budgets-{suite}.json"
"""A suite's own A/A pairs under the results root: a timing method (engine starts, timed windows,
pinned cores) sets its own noise, so a comparison of that suite's runs reads its file."""


def budget_file_for(root: Path, selections: Iterable[str]) -> Path:
    """The budget file a comparison of ``selections`` reads: ``SUITE_BUDGET_FILE`` where every
    selection names one and the same ``suite=`` and that file exists, else ``BUDGET_FILE``."""
    suites = set()
    for spec in selections:
        named = {v for k, neg, v in _terms(spec) if k == "suite" and not neg}
        suites.add(next(iter(named)) if len(named) == 1 else None)
    if len(suites) == 1 and (suite := suites.pop()) is not None:
        own = Path(root) / SUITE_BUDGET_FILE.format(suite=suite)
        if own.exists():
            return own
    return Path(root) / BUDGET_FILE


def _terms(spec: str) -> list[tuple[str, bool, str]]:
    """A selection's terms; a results file or folder (a path that exists, as ``store.select``
    tells them apart) has none."""
    from specwatch.store.select import parse_terms

    return [] if Path(spec).exists() else parse_terms(spec)


@dataclass
class DetectionFloor:
    """The floor per class and metric, and the held-out check behind it."""

    threshold: float
    """``compare``'s plain threshold: no floor is below it."""
    pairs: int = 0
    """A/A pairs read (clean and not)."""
    clean_pairs: int = 0
    """Pairs whose runs differ in no condition (``aa_differences``): only they are judged."""
    margin: Optional[float] = None
    """The largest of ``margins`` (the noisiest metric's); ``MARGINS[0]`` where no judged pair has
    a timed row; None: no pair."""
    held_out_rate: Optional[float] = None
    """Held-out false-positive rate over every timed row of the clean pairs, each metric at its own
    margin of ``margins``."""
    timed: int = 0
    """Timed metrics of the clean pairs the rate is over."""
    floors: dict[str, float] = field(default_factory=dict)
    """``CLASS/METRIC`` -> the smallest relative change called a regression."""
    source: Optional[str] = None
    """The budget file the pairs came from."""
    margins: dict[str, float] = field(default_factory=dict)
    """Metric name -> its margin (``MARGINS``): the smallest at which none of its rows of the clean
    pairs is flagged held out, pooled over the classes. Empty where the floor was loaded from a
    stored dict without it (``store.result_cache``): ``margin`` then applies to every metric."""
    spreads: dict[str, float] = field(default_factory=dict)
    """``CLASS/METRIC`` -> the widest ``window_spread`` of the clean pairs' runs: the noise the
    floor was measured at (``analysis.pair_noise`` checks a compared pair against it)."""
    per_spread: dict[str, float] = field(default_factory=dict)
    """Metric name -> the budget per unit of a compared row's window spread: its margin of
    ``spread_margins`` x the largest A/A change / spread of the clean pairs' rows, pooled over
    the classes (``budget_at``). Empty: no clean pair's row had a spread."""
    spread_margins: dict[str, float] = field(default_factory=dict)
    """Metric name -> the margin of ``per_spread`` (``MARGINS``): the smallest at which no row of
    the clean pairs with a spread is flagged held out under the scaled budget."""
    spread_min: Optional[float] = None
    """The least scaled budget: the threshold the A/A pairs were judged at (kept where a caller
    reports the floor at another threshold, as ``floors`` keep theirs); None: ``threshold``."""
    class_pairs: dict[str, int] = field(default_factory=dict)
    """Noise class -> the clean A/A pairs with a timed row of it: how many pairs its floors rest on."""

    def floor(self, klass: str, metric: str) -> float:
        return self.floors.get(f"{klass}/{metric}", self.threshold)

    def budgets(self) -> dict[str, float]:
        """The budgets ``compare`` applies under this floor (``budget_rule.budget_for``): each measured
        class and metric's floor, and each metric's ``per_spread`` factor under
        ``budget_rule.SPREAD_KEY`` with the least scaled budget under the key alone."""
        scaled = {f"{SPREAD_KEY}{m}": k for m, k in self.per_spread.items()}
        if scaled:
            scaled[SPREAD_KEY] = self.least_scaled
        return {**self.floors, **scaled}

    def budget_at(self, klass: str, metric: str, spread: Optional[float]) -> float:
        """The change a row of ``klass`` and ``metric`` with window ``spread`` must exceed to be
        called: ``budget_rule.budget_for`` under ``budgets`` (``per_spread`` x the spread where a pair
        measured the class and metric, else the class floor, else the threshold)."""
        return budget_for(self.budgets(), klass, metric, self.threshold, spread)

    def scales(self, klass: str, metric: str, spread: Optional[float]) -> bool:
        """Whether a row's budget is scaled to its ``spread`` (``budget_rule.spread_factor``)."""
        return spread_factor(self.budgets(), klass, metric, spread) is not None

    @property
    def least_scaled(self) -> float:
        """The least budget of the scaled rule (``spread_min``, else ``threshold``)."""
        return self.threshold if self.spread_min is None else self.spread_min

    def frame(self) -> pd.DataFrame:
        """One row per noise class, one column per timed metric: its floor as a percentage; then the
        widest window spread of ``SPREAD_SHOWN`` in the A/A runs (``spreads``), the noise they hold at,
        and last the clean pairs the class's floors rest on (``PAIRS_COLUMN``)."""
        if not self.floors:
            return pd.DataFrame()
        s = pd.Series(self.floors, name="floor").rename_axis("key").reset_index()
        s[["class", "metric"]] = s.key.str.rsplit("/", n=1, expand=True)
        t = s.pivot(index="class", columns="metric", values="floor")
        metrics = list(t.columns)  # the per-spread row's columns, before the trailing ones
        t = t.apply(lambda col: col.map(lambda v: f"{v:.1%}" if v == v else "-"))
        spread = {k.rsplit("/", 1)[0]: v for k, v in self.spreads.items() if metric_of(k) == SPREAD_SHOWN}
        t[f"A/A {SPREAD_SHOWN} window spread"] = [f"{spread[c]:.1%}" if c in spread else "-" for c in t.index]
        t[PAIRS_COLUMN] = [str(self.class_pairs[c]) if c in self.class_pairs else "-" for c in t.index]
        if self.per_spread:  # the scaled rule's row: the budget per unit of a compared row's spread
            t.loc[PER_SPREAD_ROW] = [f"{self.per_spread[m]:.2f}x" if m in self.per_spread else "-" for m in metrics] + [
                "-"
            ] * (len(t.columns) - len(metrics))
        return t.reset_index()

    def header(self, keys: Iterable[str] = (), spreads: Optional[dict[str, float]] = None) -> list[str]:
        """The lines a ``compare`` report opens with: how the floor was measured, then the floor of
        each ``CLASS/METRIC`` of ``keys`` (the report's timed rows; all when empty), and where the
        scaled rule applies, the budget at the widest window spread of the report's rows of that
        key (``spreads``) and the per-spread factors."""
        if self.margin is None:
            return [
                f"Detection floor: no A/A pairs ({self.source or BUDGET_FILE}): a timed change is "
                f"called past the {self.threshold:.0%} threshold, its false-positive rate unmeasured.",
                "",
            ]
        keys = sorted(set(keys)) or sorted(self.floors)
        spreads = spreads or {}
        by_class: dict[str, list[str]] = {}
        for k in keys:
            klass, metric = k.rsplit("/", 1)
            known = "" if k in self.floors else " (no A/A)"
            spread = spreads.get(k)
            at = f" at {spread:.1%} spread" if self.scales(klass, metric, spread) else ""
            by_class.setdefault(klass, []).append(f"{metric} {self.budget_at(klass, metric, spread):.1%}{at}{known}")
        shown = "; ".join(f"{c}{self._pairs_text(c)}: {', '.join(ms)}" for c, ms in by_class.items())
        margins = self.margin_text([metric_of(k) for k in keys if k in self.floors])
        above = f", above the {GOAL:.0%} goal" if (self.held_out_rate or 0.0) > GOAL else ""
        lines = [
            f"Detection floor (smallest change called a regression with <= {GOAL:.0%} held-out A/A false "
            f"positives; {self.clean_pairs} clean of {self.pairs} A/A pairs in {self.source}, {margins}, "
            f"held out {self.held_out_rate:.1%} of {self.timed} timed metrics{above}): {shown}",
            "",
        ]
        # a paired class's rows keep their class floor (``noise_class.PAIRED_SUFFIX``)
        unpaired = {metric_of(k) for k in keys if not k.rsplit("/", 1)[0].endswith(PAIRED_SUFFIX)}
        scaled = sorted(unpaired & set(self.per_spread))
        if scaled:
            factors = ", ".join(f"{m} {self.per_spread[m]:.2f}" for m in scaled)
            lines[-1:-1] = [
                "",
                "Scaled to each compared row's window spread (the budget is factor x the wider side's "
                f"interdecile window spread, at least {self.least_scaled:.0%}; rows without one take the class "
                f"floor): {factors}.",
            ]
        return lines

    def _pairs_text(self, klass: str) -> str:
        """`` (N A/A pairs)`` behind a class in the header; empty where no count was kept."""
        n = self.class_pairs.get(klass)
        return "" if n is None else f" ({n} A/A pair{'s' if n != 1 else ''})"

    def margin_text(self, metrics: Optional[Iterable[str]] = None) -> str:
        """``margin M`` of ``metrics`` (None: every metric of ``margins``), M the margin most of
        them have (the smaller on a tie), each metric with another margin named after it in
        brackets, largest first: ``margin 1 (probe_time_per_batch 3, engine_start_time 2)``;
        ``no A/A pairs`` without any pair."""
        if self.margin is None:
            return "no A/A pairs"
        names = self.margins if metrics is None else set(metrics)
        shown = {m: self.margins.get(m, self.margin) for m in names}
        if not shown:
            return f"margin {self.margin:g}"
        values = sorted(shown.values())
        common = max(values, key=values.count)
        others = sorted(((g, m) for m, g in shown.items() if g != common), key=lambda t: (-t[0], t[1]))
        listed = f" ({', '.join(f'{m} {g:g}' for g, m in others)})" if others else ""
        return f"margin {common:g}{listed}"


def detection_floor(
    pairs: list[tuple[list[CaseRecord], list[CaseRecord]]],
    threshold: float = 0.05,
    alpha: float = 0.1,
    source: Optional[str] = None,
) -> DetectionFloor:
    """The floor from A/A pairs (each its base and head records)."""
    rows = [aa_rows(b, h, alpha) for b, h in pairs]
    clean = [not aa_differences(b, h) for b, h in pairs]
    return floor_of(rows, clean, threshold, source)


def floor_of(
    rows: list[list[AARow]], clean: list[bool], threshold: float, source: Optional[str] = None
) -> DetectionFloor:
    """The floor from each A/A pair's timed rows (``aa_rows``) and whether the pair is clean: per
    metric the smallest margin with no held-out flag (``aa_rows.held_out_flags``), then the overall
    held-out rate at those margins (``GOAL`` is checked on it: ``header`` says where it is above)
    and the floors."""
    spreads = [largest_changes(r) for r in rows]
    out = DetectionFloor(threshold, len(rows), sum(clean), source=source)
    if not rows:
        return out
    judged = [i for i, c in enumerate(clean) if c] or list(range(len(rows)))
    out.timed = sum(len(rows[i]) for i in judged)
    flags = {margin: held_out_flags(rows, spreads, judged, margin, threshold) for margin in MARGINS}
    measured = sorted({metric_of(r.key) for i in judged for r in rows[i]})
    margins = {m: next((g for g in MARGINS if not flags[g].get(m)), MARGINS[-1]) for m in measured}
    out.margin = max(margins.values(), default=MARGINS[0])
    flagged = sum(flags[g].get(m, 0) for m, g in margins.items())
    out.held_out_rate = flagged / out.timed if out.timed else 0.0
    merged = reduce(merge_budgets, spreads, {})
    # a metric only the pairs not judged measured: the largest margin chosen, its rate unmeasured
    out.margins = {m: margins.get(m, out.margin) for m in sorted({metric_of(k) for k in merged} | set(margins))}
    out.floors = {k: max(threshold, out.margins[metric_of(k)] * v) for k, v in sorted(merged.items())}
    for r in (r for i in judged for r in rows[i] if r.spread is not None):
        out.spreads[r.key] = max(out.spreads.get(r.key, 0.0), r.spread)
    out.spreads = dict(sorted(out.spreads.items()))
    for i in judged:
        for klass in {r.key.rsplit("/", 1)[0] for r in rows[i]}:
            out.class_pairs[klass] = out.class_pairs.get(klass, 0) + 1
    out.class_pairs = dict(sorted(out.class_pairs.items()))
    # the scaled rule: per metric, a margin x the largest change / spread, held out as the floors are
    top = top_ratios(rows, judged)
    if not top:
        return out
    others = leave_one_out(rows, judged)
    scaled_flags = {margin: held_out_scaled(rows, others, margin, threshold) for margin in MARGINS}
    out.spread_margins = {m: next((g for g in MARGINS if not scaled_flags[g].get(m)), MARGINS[-1]) for m in top}
    out.per_spread = {m: out.spread_margins[m] * v for m, v in sorted(top.items())}
    out.spread_min = threshold
    # the held-out rate of the rule as applied: scaled rows under their margin, the rest under the floors'
    skip = scaled_rows(rows, others)
    fixed = {g: held_out_flags(rows, spreads, judged, g, threshold, skip) for g in set(margins.values())}
    flagged = sum(scaled_flags[g].get(m, 0) for m, g in out.spread_margins.items())
    flagged += sum(fixed[g].get(m, 0) for m, g in margins.items())
    out.held_out_rate = flagged / out.timed if out.timed else 0.0
    return out


SPREAD_SHOWN = "decode_throughput"
"""The metric whose A/A window spread ``DetectionFloor.frame`` shows beside the floors."""

PAIRS_COLUMN = "A/A pairs"
"""``DetectionFloor.frame``'s column of the clean pairs each class's floors rest on (``class_pairs``)."""

PER_SPREAD_ROW = "x window spread"
"""``DetectionFloor.frame``'s row of the scaled rule's factors (``per_spread``)."""

FLOOR_FIELDS = 4
"""Bumped when ``DetectionFloor`` gains a field: a floor kept in the store without it is computed again."""


def store_floor(
    root: Path, budget_file: Optional[Path] = None, threshold: float = 0.05, alpha: float = 0.1
) -> DetectionFloor:
    """``detection_floor`` of the A/A pairs in ``budget_file`` (default: ``root/noise-budgets.json``),
    each pair's selections read from the store under ``root`` as frame rows (``select_rows``: the
    same records ``select`` gives, from the Parquet caches, none parsed); no file: no pair. The
    floor is kept in the store (``store.result_cache``) while the budget file and every results
    file its pairs read are unchanged."""
    from dataclasses import asdict

    from specwatch.store.result_cache import cached_result
    from specwatch.store.select_frame import selection_files

    path = Path(budget_file) if budget_file is not None else Path(root) / BUDGET_FILE
    if not path.exists():
        return DetectionFloor(threshold, source=str(path))
    pairs = BudgetFile.load(path).pairs
    files = [path, *(f for p in pairs for s in p.selections() for f in selection_files(s, root))]
    return cached_result(
        root,
        "detection-floor",
        {"budgets": str(path), "threshold": threshold, "alpha": alpha, "fields": FLOOR_FIELDS},
        files,
        lambda: _pairs_floor(pairs, root, threshold, alpha, str(path)),
        asdict,
        lambda d: DetectionFloor(**d),
    )


def file_threshold(path: Optional[Path], default: float = 0.05) -> float:
    """The plain threshold a budget file's A/A pairs were measured at (``BudgetFile.threshold``),
    else ``default``: the floor ``compare`` reports is the one the dashboard shows for that file."""
    if path is None or not Path(path).exists():
        return default
    recorded = BudgetFile.load(path).threshold
    return default if recorded is None else recorded


def compare_budgets(floor: DetectionFloor) -> Optional[dict[str, float]]:
    """The budgets a ``compare`` without ``--budgets`` applies: each measured class and metric's
    floor, and each metric's budget per unit of window spread under ``budget_rule.SPREAD_KEY`` (which
    ``budget_rule.budget_for`` scales by a row's spread), so a change is called exactly where the
    report's header says it can be; None where no A/A pair measured any (the plain threshold then)."""
    return floor.budgets() or None


def store_floors(root: Path, threshold: float = 0.05, alpha: float = 0.1) -> tuple[DetectionFloor, ...]:
    """``store_floor`` of ``BUDGET_FILE`` and of every suite's own file (``SUITE_BUDGET_FILE``) under
    ``root``, in that order (the first one's pairs may be none), each at the threshold its file
    records (``BudgetFile.threshold``), else ``threshold``."""
    files = [Path(root) / BUDGET_FILE, *sorted(Path(root).glob(SUITE_BUDGET_FILE.format(suite="*")))]
    return tuple(store_floor(root, f, file_threshold(f, threshold), alpha) for f in files)


def _pairs_floor(pairs: list, root: Path, threshold: float, alpha: float, source: str) -> DetectionFloor:
    """``store_floor`` of the budget file's ``pairs``, computed."""
    import orjson

    from specwatch.store.frame import CONDITIONS_COLUMN
    from specwatch.store.select_frame import SELECT_COLUMNS, select_rows

    rows, clean = [], []
    for p in pairs:
        b, h = (select_rows(s, root, [*SELECT_COLUMNS, CONDITIONS_COLUMN]) for s in p.selections())
        if not b.empty and not h.empty:
            rows.append(timed_rows(frame_rows(b, h, threshold=0.0, alpha=alpha)))
            b_cond, h_cond = ([orjson.loads(c) for c in side[CONDITIONS_COLUMN]] for side in (b, h))
            clean.append(not condition_differences(b_cond, h_cond))
    return floor_of(rows, clean, threshold, source=source)
