"""Per-PR comparison: two result selections -> one verdict per (case, metric), as markdown.

Verdicts: regressed, improved, unchanged, changed (exact metric with no better direction), new,
gone, now failing, now fixed.

* Exact metrics (``Metric.exact``: oracle acceptance, lossless mismatches, memory bytes, leaked
  tokens) and checks: any change in the bad direction is a regression.
* Timed metrics: a change counts only when both hold: the medians differ by more than
  ``threshold`` (relative, default 5%), and a two-sided Mann-Whitney U test on the per-repeat
  samples gives p <= ``alpha``. With 3 repeats per side the smallest p that test can give is 0.1
  (all of one side above all of the other), hence the default ``alpha = 0.1``; use more repeats
  for a stricter alpha.
"""

from __future__ import annotations

import json
import statistics

from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from pathlib import Path
from typing import Iterable, Optional

from scipy.stats import mannwhitneyu

from specwatch.errors import SpecwatchInputError
from specwatch.record import CaseRecord, Metric, Status
from specwatch.store import load_records, result_files


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
    """A timed metric compared on per-repeat samples (both sides have at least 2)."""
    noise_class: str = ""
    """The case's noise class (``noise_class``): where a noise budget applies."""

    @property
    def ratio(self) -> Optional[float]:
        if self.base in (None, 0) or self.head is None:
            return None
        return self.head / self.base


def run_key(r: CaseRecord) -> str:
    """The run a record belongs to: its ``run_id``; records from before run ids existed are keyed by
    their specwatch commit (then a run was one commit's sweep, as for the first smoke A/A pair)."""
    return r.provenance.run_id or f"commit:{r.provenance.specwatch_commit}"


def newest_run(recs: list[CaseRecord], n: int, spec: str) -> str:
    """The ``run_key`` of the n-th newest run among ``recs`` (runs ordered by their first record's
    start): ``run=-N`` in a selection, e.g. ``run=-2`` vs ``run=-1`` for an A/A pair."""
    first: dict[str, datetime] = {}
    for r in recs:
        k = run_key(r)
        first[k] = min(first.get(k, r.provenance.started_at), r.provenance.started_at)
    runs = sorted(first, key=first.get)
    if not 1 <= n <= len(runs):
        raise SpecwatchInputError(None, f"run -{n}: the selection holds {len(runs)} run(s)", field=spec)
    return runs[-n]


SELECT_FIELDS = {
    "sglang_version": lambda r: r.provenance.sglang_version,
    "sglang_commit": lambda r: r.provenance.sglang_commit,
    "specwatch_commit": lambda r: r.provenance.specwatch_commit,
    "machine": lambda r: r.provenance.machine,
    "suite": lambda r: r.suite,
    "fault": lambda r: r.provenance.fault or "none",
    "probe": lambda r: "on" if r.provenance.probe else "off",
    "overlap": lambda r: "on" if r.overlap_starts else "off",
    "run": run_key,
}
"""FIELD -> the value of a record a FIELD=VALUE selection term compares with."""


def select(spec: str, root: Path) -> list[CaseRecord]:
    """A selection: a JSONL file or folder, or FIELD=VALUE[,FIELD!=VALUE...] over the store's records
    (fields: ``SELECT_FIELDS``; ``!=`` excludes, e.g. an A/A comparison of one run against the
    earlier runs of the same version).
    ``FIELD=A|B`` matches either value (``run=ID1|ID2``: a side made of two runs).
    ``run`` takes a run id or ``-N``, the N-th newest run of the records the other terms select
    (``run=-2`` and ``run=-1``: the last two runs, an A/A pair of one session).
    Fault-injection and bare (probe-off) runs share case ids with clean runs, so a FIELD=VALUE
    selection holds clean, probed runs only unless it names ``fault`` or ``probe`` (``probe=off``),
    and runs whose starts overlapped timed batches (``--overlap-starts``: noisier timing) only when
    it names ``overlap`` (``overlap=on``)."""
    p = Path(spec)
    if p.exists():
        return load_records([p] if p.is_file() else result_files(p))
    terms = []
    for term in spec.split(","):
        key, sep, value = term.partition("=")
        if not sep or key.rstrip("!") not in SELECT_FIELDS:
            raise SpecwatchInputError(None, f"not a results file or FIELD=VALUE with FIELD in {sorted(SELECT_FIELDS)}",
                                      field=spec)
        terms.append((key.rstrip("!"), key.endswith("!"), value))
    recs = load_records(result_files(root))
    named = {key for key, _, _ in terms}
    if "fault" not in named:
        recs = [r for r in recs if r.provenance.fault is None]
    if "probe" not in named:
        recs = [r for r in recs if r.provenance.probe]
    if "overlap" not in named:
        recs = [r for r in recs if not r.overlap_starts]
    for key, negate, value in sorted(terms, key=lambda t: t[0] == "run"):   # run=-N counts within the rest
        if key == "run" and value.startswith("-") and value[1:].isdigit():
            value = newest_run(recs, int(value[1:]), spec)
        values = set(value.split("|"))                      # FIELD=A|B: either
        recs = [r for r in recs if (str(SELECT_FIELDS[key](r)) in values) != negate]
    return recs


def latest_by_case(records: Iterable[CaseRecord]) -> dict[str, CaseRecord]:
    """The newest record of each case (a resumed sweep may hold several)."""
    out: dict[str, CaseRecord] = {}
    for r in sorted(records, key=lambda r: r.provenance.started_at):
        out[r.case_id] = r
    return out


def _timed_verdict(b: Metric, h: Metric, threshold: float, alpha: float) -> tuple[Verdict, str]:
    rel = (h.value - b.value) / b.value if b.value else 0.0
    if abs(rel) <= threshold:
        return Verdict.unchanged, f"{rel:+.1%} within {threshold:.0%}"
    if len(b.samples) < 2 or len(h.samples) < 2:
        return Verdict.unchanged, f"{rel:+.1%}, too few samples to tell from noise"
    p = mannwhitneyu(b.samples, h.samples, alternative="two-sided").pvalue
    if p > alpha:
        return Verdict.unchanged, f"{rel:+.1%}, p={p:.2f} > {alpha}"
    better = (rel > 0) == bool(h.higher_is_better)
    return (Verdict.improved if better else Verdict.regressed), f"{rel:+.1%}, p={p:.3f}"


def _exact_verdict(b: Metric, h: Metric) -> tuple[Verdict, str]:
    if h.value == b.value:
        return Verdict.unchanged, ""
    if h.higher_is_better is None:
        return Verdict.changed, "exact metric"
    better = (h.value > b.value) == h.higher_is_better
    return (Verdict.improved if better else Verdict.regressed), "exact metric"


def noise_class(case) -> str:
    """Cases whose timings share a noise level: model size and batch size (a tiny model at batch 1
    is bound by the CPU scheduler and far noisier between runs than an 8b model at batch 8)."""
    return f"{case.model.value}/bs{case.batch_size}"


def budget_key(budgets: Optional[dict], klass: str, metric: str) -> Optional[str]:
    """The budget that applies to a class's timed metric: ``CLASS/METRIC``, else ``CLASS``, else None."""
    return next((k for k in (f"{klass}/{metric}", klass) if k in (budgets or {})), None)


def budget_for(budgets: Optional[dict], klass: str, metric: str, threshold: float) -> float:
    """The relative change a timed metric must exceed: the class/metric budget when one is set
    (never below ``threshold``), else ``threshold``."""
    key = budget_key(budgets, klass, metric)
    return threshold if key is None else max(threshold, budgets[key])


SIZING_EXPLAINED = frozenset({"req_to_token_bytes", "req_to_token_row_width", "sglang_alloc_len_per_decode",
                              "model_req_to_token_bytes"})
"""Memory metrics whose change the two SGLang versions' own sizing functions can explain."""


def sizing_change(base: CaseRecord, head: CaseRecord) -> str:
    """Why a memory metric moved: the fields of the running SGLang's own sizing (recorded per case
    by the GPU worker) that differ between the two records, or '' when neither recorded it."""
    b, h = (r.details.get("sglang_sizing") or {} for r in (base, head))
    if "error" in b or "error" in h or not b or not h:
        return ""
    moved = [f"{k} {b[k]}→{h[k]}" for k in sorted(set(b) & set(h)) if b[k] != h[k] and b[k] is not None]
    return ("SGLang's sizing: " + ", ".join(moved)) if moved else "SGLang's sizing unchanged: look elsewhere"


def compare_records(base: Iterable[CaseRecord], head: Iterable[CaseRecord], threshold: float = 0.05,
                    alpha: float = 0.1, budgets: Optional[dict] = None) -> list[Row]:
    b_by, h_by = latest_by_case(base), latest_by_case(head)
    rows: list[Row] = []
    for cid in sorted(set(b_by) | set(h_by)):
        b, h = b_by.get(cid), h_by.get(cid)
        label = (h or b).case.label()
        if b is None or h is None:
            rows.append(Row(cid, label, "status", None, None, "", Verdict.new if b is None else Verdict.gone,
                            (h or b).status.value))
            continue
        if b.status is Status.ok and h.status is not Status.ok:
            rows.append(Row(cid, label, "status", None, None, "", Verdict.now_failing,
                            f"{h.status.value}: {(h.reason or '')[:200]}"))
            continue
        if b.status is not Status.ok and h.status is Status.ok:
            rows.append(Row(cid, label, "status", None, None, "", Verdict.now_fixed, f"was {b.status.value}"))
        if h.status is not Status.ok:
            continue
        for name, hm in h.metrics.items():
            bm = b.metrics.get(name)
            if bm is None:
                rows.append(Row(cid, label, name, None, hm.value, hm.unit, Verdict.new))
                continue
            klass = noise_class(h.case)
            if hm.exact:
                verdict, note = _exact_verdict(bm, hm)
                if verdict is not Verdict.unchanged and name in SIZING_EXPLAINED:
                    note = "; ".join(x for x in (note, sizing_change(b, h)) if x)
            else:
                verdict, note = _timed_verdict(bm, hm, budget_for(budgets, klass, name, threshold), alpha)
                if budgets and verdict is not Verdict.unchanged and budget_key(budgets, klass, name) is None:
                    # the A/A pairs behind the budgets never measured this class/metric (a new metric, a
                    # new model or batch size): the plain threshold applied, say so next to the verdict
                    note = f"{note}; no noise budget for {klass}/{name}: {threshold:.0%} threshold"
            timed = not hm.exact and len(bm.samples) >= 2 and len(hm.samples) >= 2
            rows.append(Row(cid, label, name, bm.value, hm.value, hm.unit, verdict, note, timed, klass))
        for name, ok in h.checks.items():
            was = b.checks.get(name)
            if was is True and not ok:
                rows.append(Row(cid, label, f"check:{name}", 1, 0, "pass", Verdict.regressed, "check now fails"))
            elif was is False and ok:
                rows.append(Row(cid, label, f"check:{name}", 0, 1, "pass", Verdict.improved, "check now passes"))
    rows.sort(key=lambda r: (ORDER[r.verdict], r.case_id, r.metric))
    return rows


def _fmt(v: Optional[float]) -> str:
    if v is None:
        return "–"
    return f"{v:.4g}" if abs(v) < 1e6 else f"{v:.4e}"


def markdown(rows: list[Row], base_name: str, head_name: str, show_unchanged: bool = False) -> str:
    counts: dict[Verdict, int] = {}
    for r in rows:
        counts[r.verdict] = counts.get(r.verdict, 0) + 1
    summary = ", ".join(f"{n} {v.value}" for v, n in sorted(counts.items(), key=lambda kv: ORDER[kv[0]]))
    lines = [f"## specwatch: `{head_name}` vs `{base_name}`", "", summary or "no cases", ""]
    shown = [r for r in rows if show_unchanged or r.verdict is not Verdict.unchanged]
    folded = [r for r in shown if _is_benign_new(r)]
    if main := [r for r in shown if not _is_benign_new(r)]:
        lines += _table(main)
    if folded:   # coverage added by the head (a sweep that grew): listed, but out of the reviewer's way
        cases = sum(r.metric == "status" for r in folded)
        what = f"{cases} case(s) only in head, healthy; {len(folded) - cases} metric(s) the base did not record"
        lines += ["", f"<details><summary>{what}</summary>", ""]
        lines += _table(folded) + ["", "</details>"]
    return "\n".join(lines) + "\n"


def _is_benign_new(r: Row) -> bool:
    """A head-only case that is ok or skipped, or a metric the base did not record yet. A head-only
    case that crashed or failed stays in the main table."""
    return r.verdict is Verdict.new and (r.metric != "status" or r.note in (Status.ok.value, Status.skipped.value))


def _table(rows: list[Row]) -> list[str]:
    out = ["| verdict | case | metric | base | head | ratio | note |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = "" if r.ratio is None else f"{r.ratio:.3f}"
        out.append(f"| {r.verdict.value} | `{r.case_id}` {r.label} | {r.metric} | {_fmt(r.base)} | "
                   f"{_fmt(r.head)} {r.unit} | {ratio} | {r.note} |")
    return out


def has_regression(rows: list[Row]) -> bool:
    return any(r.verdict in BAD for r in rows)


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
    vals = [statistics.mean(v for v in (d.get("before"), d.get("after")) if v is not None)
            for d in ((r.details or {}).get("host_load") or {} for r in recs)
            if d.get("before") is not None or d.get("after") is not None]
    return statistics.median(vals) if vals else None


def aa_differences(base: Iterable[CaseRecord], head: Iterable[CaseRecord]) -> list[str]:
    """What makes two runs not an A/A pair: run conditions that differ between them (SGLang version,
    machine, GPU, driver, probe on/off, parallel starts, engine arguments), each as one line."""
    def conditions(recs) -> dict[str, set]:
        out: dict[str, set] = {}
        for r in recs:
            p, d = r.provenance, r.details or {}
            for key, value in (("sglang_version", p.sglang_version), ("machine", p.machine),
                               ("gpu_name", p.gpu_name), ("driver_version", p.driver_version),
                               ("probe", p.probe), ("parallel_starts", d.get("parallel_starts") or 1),
                               ("overlap_starts", r.overlap_starts),
                               ("engine_kwargs", json.dumps(d.get("engine_kwargs"), sort_keys=True)
                                if d.get("engine_kwargs") is not None else None)):
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
