"""A/A noise: pairs of runs of the same code, the false-positive rate under the noise budgets, held-out checks."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from typing import Iterable, Optional

from specwatch.analysis.compare import Row, Verdict, budget_key, compare_records
from specwatch.core.record import CaseRecord


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


def held_out(pairs: list[tuple[list[CaseRecord], list[CaseRecord]]], threshold: float = 0.05,
             alpha: float = 0.1, margin: float = 1.5) -> list[HeldOut]:
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
        out.append(HeldOut(i, len(judged), plain[i].flagged, noise_report(judged).flagged,
                           sum(budget_key(budgets, r.noise_class, r.metric) is None for r in judged)))
    return out


HOST_LOAD_GAP = 1.0
"""Difference in the hosts' load average (one busy core) that makes two runs not an A/A pair."""


def host_load(recs: list[CaseRecord]) -> Optional[float]:
    """Median over records of the host's load average around each case (``details.host_load``)."""
    vals = [statistics.mean(v for v in (d.before, d.after) if v is not None)
            for d in (r.details.host_load for r in recs)
            if d is not None and (d.before is not None or d.after is not None)]
    return statistics.median(vals) if vals else None


def aa_differences(base: Iterable[CaseRecord], head: Iterable[CaseRecord]) -> list[str]:
    """What makes two runs not an A/A pair: run conditions that differ between them (SGLang version,
    machine, GPU, driver, probe on/off, parallel starts, engine arguments), each as one line."""
    def conditions(recs) -> dict[str, set]:
        out: dict[str, set] = {}
        for r in recs:
            p, d = r.provenance, r.details
            for key, value in (("sglang_version", p.sglang_version), ("machine", p.machine),
                               ("gpu_name", p.gpu_name), ("driver_version", p.driver_version),
                               ("probe", p.probe), ("parallel_starts", d.parallel_starts or 1),
                               ("overlap_starts", r.overlap_starts),
                               ("engine_kwargs", json.dumps(d.engine_kwargs, sort_keys=True)
                                if d.engine_kwargs is not None else None)):
                out.setdefault(key, set()).add(value)
        return out

    base, head = list(base), list(head)
    b, h = conditions(base), conditions(head)
    lines = []
    loads = [host_load(recs) for recs in (base, head)]
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
