"""A/A noise: pairs of runs of the same code, the false-positive rate under the noise budgets, held-out checks."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional

import pandas as pd
from pydantic import BaseModel, ConfigDict, ValidationError

from specwatch.analysis.budget_rule import budget_key
from specwatch.analysis.compare import Row, Verdict, compare_records
from specwatch.core.errors import SpecwatchInputError
from specwatch.core.record import CaseRecord
from specwatch.store.frame import run_conditions


@dataclass
class NoiseReport:
    """An A/A comparison (two runs of the same SGLang): how many timed metrics a report would flag,
    and the between-run spread per noise class and metric."""

    timed: int
    flagged: int
    spread: dict[str, float]
    """``CLASS/METRIC`` -> largest relative change seen between the two runs."""

    @property
    def false_positive_rate(self) -> float:
        return self.flagged / self.timed if self.timed else 0.0

    def budgets(self, margin: float = 1.5, floor: float = 0.05) -> dict[str, float]:
        """Noise budgets (TorchBench style): ``margin`` x the A/A spread, at least ``floor``."""
        return {k: round(max(floor, margin * v), 4) for k, v in sorted(self.spread.items())}


def merge_budgets(old: dict[str, float], new: dict[str, float]) -> dict[str, float]:
    """Budgets from several A/A pairs: per class/metric the largest (each pair's run-to-run
    noise is a sample; a budget must cover every pair seen, and classes only one pair has stay)."""
    return {k: max(old.get(k, 0.0), new.get(k, 0.0)) for k in sorted(set(old) | set(new))}


def pair_selections(pair: dict) -> tuple[str, str]:
    """The base and head selections of an A/A pair as a budget file records it, with a relative
    ``run=-N`` term replaced by the run id it meant when the pair was measured (newer runs must not
    move an old pair)."""

    def pinned(spec: str, runs: list) -> str:
        terms = spec.split(",")
        if len(runs or []) == 1 and any(t.startswith("run=-") for t in terms):
            terms = [f"run={runs[0]}" if t.startswith("run=-") else t for t in terms]
        return ",".join(terms)

    return pinned(pair["base"], pair.get("base_runs")), pinned(pair["head"], pair.get("head_runs"))


@dataclass
class HeldOut:
    """One A/A pair judged under the noise budgets of every other pair (leave one out)."""

    pair: int
    """Index of the pair in the budget file."""
    timed: int
    flagged_plain: int
    """Timed metrics flagged at the plain threshold (no budgets)."""
    flagged: int
    """Timed metrics flagged under the other pairs' budgets."""
    unbudgeted: int
    """Timed metrics whose class/metric no other pair measured (judged at the plain threshold)."""


def held_out(
    pairs: list[tuple[list[CaseRecord], list[CaseRecord]]],
    threshold: float = 0.05,
    alpha: float = 0.1,
    margin: float = 1.5,
) -> list[HeldOut]:
    """The false-positive rate of ``compare --budgets`` measured honestly: each A/A pair against
    budgets derived (``NoiseReport.budgets``, merged) from the other pairs only."""
    plain = [noise_report(compare_records(b, h, threshold=threshold, alpha=alpha)) for b, h in pairs]
    own = [rep.budgets(margin, threshold) for rep in plain]
    out = []
    for i, (b, h) in enumerate(pairs):
        budgets: dict[str, float] = {}
        for j, bj in enumerate(own):
            if j != i:
                budgets = merge_budgets(budgets, bj)
        judged = [r for r in compare_records(b, h, threshold=threshold, alpha=alpha, budgets=budgets) if r.timed]
        out.append(
            HeldOut(
                i,
                len(judged),
                plain[i].flagged,
                noise_report(judged).flagged,
                sum(budget_key(budgets, r.noise_class, r.metric) is None for r in judged),
            )
        )
    return out


HOST_LOAD_GAP = 1.0
"""Difference in the hosts' load average (one busy core) that makes two runs not an A/A pair."""


def host_load(recs: list[CaseRecord]) -> Optional[float]:
    """Median over records of the host's load average around each case (``details.host_load``)."""
    return _median_load([run_conditions(r) for r in recs])


def _median_load(conditions: list[dict]) -> Optional[float]:
    vals = [c["host_load"] for c in conditions if c["host_load"] is not None]
    return statistics.median(vals) if vals else None


def aa_differences(base: Iterable[CaseRecord], head: Iterable[CaseRecord]) -> list[str]:
    """What makes two runs not an A/A pair: run conditions that differ between them (SGLang version,
    machine, GPU, driver, probe on/off, parallel starts, engine arguments), each as one line."""
    return condition_differences([run_conditions(r) for r in base], [run_conditions(r) for r in head])


def condition_differences(base: list[dict], head: list[dict]) -> list[str]:
    """``aa_differences`` of two runs given as their records' ``store.frame.run_conditions``."""

    def conditions(recs: list[dict]) -> dict[str, set]:
        out: dict[str, set] = {}
        for c in recs:
            for key, value in c.items():
                if key != "host_load":
                    out.setdefault(key, set()).add(value)
        return out

    b, h = conditions(base), conditions(head)
    lines = []
    loads = [_median_load(recs) for recs in (base, head)]
    if None not in loads and abs(loads[0] - loads[1]) >= HOST_LOAD_GAP:
        lines.append(f"host load while timing (1-min average, median over cases): {loads[0]:.1f} vs {loads[1]:.1f}")
    for key in sorted(set(b) | set(h)):
        bv, hv = b.get(key, set()) - {None}, h.get(key, set()) - {None}
        if bv and hv and bv != hv:
            if key == "engine_kwargs":
                lines.append("engine arguments differ")
            else:
                lines.append(f"{key}: {', '.join(sorted(map(str, bv)))} vs {', '.join(sorted(map(str, hv)))}")
    return lines


def noise_report(rows: list[Row]) -> NoiseReport:
    timed = [r for r in rows if r.timed]
    spread: dict[str, float] = {}
    for r in timed:
        if r.ratio is not None:
            key = f"{r.noise_class}/{r.metric}"
            spread[key] = max(spread.get(key, 0.0), abs(r.ratio - 1.0))
    return NoiseReport(len(timed), sum(r.verdict in (Verdict.regressed, Verdict.improved) for r in timed), spread)


class AAPair(BaseModel):
    """One A/A pair as a budget file records it (``specwatch noise -o``). Files written from a
    single pair may lack the counts; unknown keys are kept as they are."""

    model_config = ConfigDict(extra="allow")

    base: str
    """Selection of the first run."""
    head: str
    """Selection of the second run."""
    base_runs: Optional[list[str]] = None
    """Run ids the base selection meant when the pair was measured (pins a relative ``run=-N``)."""
    head_runs: Optional[list[str]] = None
    """Run ids the head selection meant when the pair was measured."""
    timed_metrics: Optional[int] = None
    """Timed metrics the pair's comparison judged."""
    flagged: Optional[int] = None
    """Timed metrics flagged at the plain threshold."""
    false_positive_rate: Optional[float] = None
    """``flagged / timed_metrics``."""
    margin: Optional[float] = None
    """Budget = margin x the largest A/A change seen."""

    def selections(self) -> tuple[str, str]:
        """Base and head selections with a relative ``run=-N`` pinned (``pair_selections``)."""
        return pair_selections(self.model_dump())


class BudgetFile(BaseModel):
    """A noise-budget file: the A/A pairs measured and the budgets ``compare --budgets`` applies."""

    pairs: list[AAPair] = []
    """Every A/A pair the budgets were derived from, oldest first."""
    budgets: dict[str, float]
    """``CLASS[/METRIC]`` -> relative change a timed metric must exceed."""
    threshold: Optional[float] = None
    """The plain threshold the budgets were derived at (``noise --threshold``), the dashboard's
    floor for this file's classes never below it; None: compare's default."""

    @classmethod
    def load(cls, path: Path) -> "BudgetFile":
        """Read a budget file; a file from one pair (its fields at the top level) reads as one pair.
        Errors are one line naming the file."""
        try:
            data = json.loads(Path(path).read_text())
            if isinstance(data, dict) and "pairs" not in data and "base" in data:
                data = {
                    "pairs": [{k: data[k] for k in AAPair.model_fields if k in data}],
                    "budgets": data.get("budgets"),
                }
            return cls.model_validate(data)
        except (OSError, ValueError) as e:
            why = f"{e.error_count()} error(s), first: {e.errors()[0]['msg']}" if isinstance(e, ValidationError) else e
            raise SpecwatchInputError(
                path, f"not a noise-budget file ({type(e).__name__}: {why})", field="budgets"
            ) from None

    def merged(self, pair: AAPair, budgets: dict[str, float], threshold: Optional[float] = None) -> "BudgetFile":
        """This file with one more pair: its pairs kept, per class/metric the larger budget, the
        smaller threshold of the two."""
        known = [t for t in (self.threshold, threshold) if t is not None]
        return BudgetFile(
            pairs=[*self.pairs, pair], budgets=merge_budgets(self.budgets, budgets), threshold=min(known, default=None)
        )

    def save(self, path: Path) -> None:
        Path(path).write_text(json.dumps(self.model_dump(exclude_none=True), indent=1) + "\n")


def aa_pair(base: str, head: str, b: list[CaseRecord], h: list[CaseRecord], rep: NoiseReport, margin: float) -> AAPair:
    """The budget file's entry for one A/A comparison. ``run=-N`` is relative to the store's newest
    run: the run ids it meant are kept beside it."""
    return AAPair(
        base=base,
        head=head,
        base_runs=sorted({r.provenance.run_id for r in b if r.provenance.run_id}),
        head_runs=sorted({r.provenance.run_id for r in h if r.provenance.run_id}),
        timed_metrics=rep.timed,
        flagged=rep.flagged,
        false_positive_rate=rep.false_positive_rate,
        margin=margin,
    )


def spread_table(rep: NoiseReport) -> pd.DataFrame:
    """The largest A/A change per noise class and metric, as printed by ``specwatch noise``."""
    return pd.DataFrame([{"class/metric": k, "max |change|": f"{v:.1%}"} for k, v in sorted(rep.spread.items())])


@dataclass
class HoldoutReport:
    """``specwatch noise-holdout``: each pair under the other pairs' budgets, and the budgets' price."""

    pairs: pd.DataFrame
    """One row per A/A pair: conditions, timed metrics, flags plain and under the other pairs' budgets."""
    summary: str
    """One line: the held-out false-positive rate over the clean pairs."""
    price: pd.DataFrame
    """Per noise class (rows) and timed metric (columns): the smallest change called a regression."""
    margin: float = 1.5
    """The margin the pairs were judged at (the file's first pair's)."""

    def markdown(self, budget_file: Path, threshold: float) -> str:
        table = self.pairs.assign(pair=self.pairs.pair.str.replace("|", "\\|", regex=False)).to_markdown(index=False)
        rule = (
            f"The rule checked is `compare --budgets {budget_file}`: each pair under the other pairs' "
            f"class budgets at margin {self.margin:g}, none scaled to a row's window spread. `compare` "
            "without `--budgets` judges by the detection floor instead (budgets scaled to each row's "
            "window spread); its held-out rate is the one each report's header gives."
        )
        return (
            f"# Held-out A/A check of {budget_file}\n\n{self.summary}\n\n{rule}\n\n{table}\n\n"
            "## Smallest change called a regression\n\n"
            "Per noise class and timed metric, the budget `compare --budgets` applies (all pairs "
            "merged): a change below it is noise by the A/A pairs' measure. Classes not listed "
            f"use the plain {threshold:.0%} threshold.\n\n{self.price.to_markdown(index=False)}\n"
        )


def holdout_report(
    budgets: BudgetFile,
    selected: list[tuple[list[CaseRecord], list[CaseRecord]]],
    threshold: float = 0.05,
    alpha: float = 0.1,
) -> HoldoutReport:
    """Each A/A pair of a budget file (``selected``: its records, in the file's order) judged under
    the budgets of the other pairs only (``held_out``), at the first pair's margin. A pair whose runs
    differ (``aa_differences``) is no A/A: its budgets count (larger, as compare uses them), its own
    flags do not."""
    margin = 1.5 if budgets.pairs[0].margin is None else budgets.pairs[0].margin
    rows, clean = [], []
    for h in held_out(selected, threshold=threshold, alpha=alpha, margin=margin):
        base, head = budgets.pairs[h.pair].selections()
        differ = aa_differences(*selected[h.pair])
        clean.append(not differ)
        rows.append(
            {
                "pair": f"{base} -> {head}",
                "conditions": "not clean, not counted: " + "; ".join(differ) if differ else "clean",
                "timed metrics": h.timed,
                f"flagged at {threshold:.0%}": h.flagged_plain,
                "flagged under the other pairs' budgets": h.flagged,
                "held-out false-positive rate": f"{h.flagged / h.timed:.1%}" if h.timed else "-",
                "no budget from another pair": h.unbudgeted,
            }
        )
    t = pd.DataFrame(rows)
    counted = t[clean]
    total, flagged = int(counted["timed metrics"].sum()), int(counted["flagged under the other pairs' budgets"].sum())
    summary = (
        f"held out, clean pairs: {flagged} of {total} timed metrics flagged ({flagged / max(total, 1):.1%}; goal <= 1%)"
    )
    # a class without a budget gets the plain threshold
    price = pd.Series(budgets.budgets, name="budget").rename_axis("key").reset_index()
    price[["class", "metric"]] = price.key.str.rsplit("/", n=1, expand=True)
    price = (
        price.pivot(index="class", columns="metric", values="budget")
        .apply(lambda col: col.map(lambda v: f"{v:.0%}" if v == v else "-"))
        .reset_index()
    )
    return HoldoutReport(t, summary, price, margin)
