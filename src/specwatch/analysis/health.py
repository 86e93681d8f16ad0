"""Coverage and health per suite, and the fault-injection table: what flagged each fault and whether clean stayed clean."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Callable, Optional

import pandas as pd

from specwatch.analysis.dcp import DCP_SUITES
from specwatch.rules.case_totals import AGREE_CHECK as AGREE
from specwatch.store.frame import case_cells, latest_rows
from specwatch.store.frame_dicts import row_dicts

RELABELS = {
    "check.no_kv_leak": ("leak_is_unflushed_cache", "radix cache left by a refused flush, not a leak"),
    "check.req_to_token_matches_model": (
        "row_matches_model_now",
        "match today's model: the model's rule, not SGLang's row",
    ),
    "check.exact_metrics_agree_across_engines": (
        "engines_agree_now",
        "agree but for counts over every batch, which timed windows vary",
    ),
}
"""Failed checks a later finding explains: check -> (records-frame column that is True for such a
record, what it was). The recorded verdicts stay (``store.leak_is_unflushed_cache``,
``store.row_matches_model_now``, ``rules.case_totals.engines_agree_now``)."""


def fault_table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (fault, case) of fault-injection runs, with the clean run of the same case and
    SGLang version beside it: what flagged the fault (status, failed checks) and whether clean stayed clean."""
    return fault_rows(fault_reads(df))


def fault_reads(df: pd.DataFrame) -> Optional[tuple[pd.DataFrame, pd.DataFrame]]:
    """All ``fault_table`` reads of a records frame: the fault runs cut to the columns a row reads
    and the clean runs of their cases (case, version, status, reason, checks); None: no fault run."""
    if "fault" not in df or df.fault.isna().all():
        return None
    checks = [c for c in df.columns if c.startswith("check.")]
    faulty = df.loc[df.fault.notna(), [c for c in dict.fromkeys([*FAULT_ROW_COLUMNS, *checks]) if c in df]]
    cols = list(dict.fromkeys(["case_id", "sglang_version", "status", "reason", *checks]))
    return faulty, df.loc[df.fault.isna() & df.case_id.isin(faulty.case_id), cols]


def fault_rows(reads: Optional[tuple[pd.DataFrame, pd.DataFrame]]) -> pd.DataFrame:
    """``fault_table`` of what ``fault_reads`` gave."""
    if reads is None:
        return pd.DataFrame()
    faulty, clean = reads
    checks = [c for c in faulty.columns if c.startswith("check.")]

    def verdict(row) -> str:
        bad = [c[len("check.") :] for c in checks if row.get(c) == False]  # noqa: E712 (numpy bools, NaN)
        if row.status != "ok":
            return f"{row.status}: {str(row.reason)[:140]}"
        return "failed: " + ", ".join(bad) if bad else "all checks pass"

    # the last clean row of each (case, SGLang version), found once instead of per fault run
    last_clean = {key: i for i, key in enumerate(zip(clean.case_id, clean.sglang_version)) if not pd.isna(key[1])}
    rows = []
    clean_rows = row_dicts(clean[["status", "reason", *checks]])
    for r in row_dicts(faulty.sort_values(["fault", "page_size", "batch_size"])):
        r = _row(r)
        c = last_clean.get((r.case_id, r.sglang_version))
        runs = r.get("fault_code_runs")
        rows.append(
            {
                "fault": r.fault,
                "sglang": r.sglang_version,
                "case": f"{r.attention_backend} p{r.page_size} "
                f"k{r.topk} bs{r.batch_size} {r.input_len}->{r.output_len}",
                "fault run": verdict(r),
                # an edit that never ran cannot be caught (records before the count say "not counted")
                "faulted code ran": "not counted"
                if runs is None or pd.isna(runs)
                else f"{int(runs)} times in its engine",
                "clean run": "no clean run" if c is None else verdict(_row(clean_rows[c])),
            }
        )
    return pd.DataFrame(rows)


FAULT_ROW_COLUMNS = (
    *("fault", "sglang_version", "case_id", "status", "reason", "fault_code_runs"),
    *("attention_backend", "page_size", "topk", "batch_size", "input_len", "output_len"),
)
"""The records-frame columns a fault-table row reads (with the checks)."""


def _row(r: dict) -> SimpleNamespace:
    """A frame row's dict read as ``fault_table``'s rows are: by attribute and by ``get``."""
    return SimpleNamespace(**r, get=r.get)


OWN_TABLES = DCP_SUITES + ("faults",)
"""Suites the dashboard shows in tables of their own (DCP support, fault injection)."""


def suite_plans(df: pd.DataFrame, suites_dir: Optional[Path] = Path("suites")) -> dict[str, Optional[pd.DataFrame]]:
    """``planned_cells`` of the file under ``suites_dir`` of each suite ``health_matrix`` reads in
    ``df`` (those with no table of their own), by name: what the matrix reads besides the records."""
    suites = sorted(set(df.suite.dropna().tolist()) - set(OWN_TABLES)) if "suite" in df else []
    return {s: planned_cells(suites_dir / f"{s}.toml" if suites_dir else None) for s in suites}


def health_matrix(
    df: pd.DataFrame,
    suites_dir: Optional[Path] = Path("suites"),
    plans: Optional[dict[str, Optional[pd.DataFrame]]] = None,
) -> pd.DataFrame:
    """Every other suite's coverage and health at a glance: one row per machine, SGLang version,
    suite, model, algorithm, backend and page size, one column per topk; a cell says how many of
    the cases the suite plans there have an ok latest record, then what went wrong in the rest (a
    non-ok status, or a failed check such as ``lossless`` or ``accept_length_matches_oracle``, with
    counts). Cells the suite plans but nothing recorded say "not run" (rows without any record are
    left out); batch sizes and profiles fold. Only cases the suite file plans today count (a case
    its validity rules now skip, or a matrix since edited, is not a gap). ``plans``: the suites'
    ``suite_plans``, where already made."""
    return pd.DataFrame() if df.empty else latest_matrix(health_rows(df), suites_dir, plans)


MATRIX_KEY = ["model", "algorithm", "attention_backend", "page_size"]
"""The columns a health matrix row is one value of (with machine, version and suite)."""


def health_rows(df: pd.DataFrame) -> pd.DataFrame:
    """All ``health_matrix`` reads of a non-empty records frame: the latest record of each case per
    machine, version and suite (those without a table of their own), cut to the columns read."""
    checks = [c for c in df.columns if c.startswith("check.")]
    # the cells read only these columns: a narrow frame is cut per cell far faster than the whole one
    used = ["machine", "sglang_version", "suite", "case_id", "topk", "status", *MATRIX_KEY, *checks]
    used += [c for c, _ in RELABELS.values()] + ["host_interference", "finished_at", "started_at", "run_id"]
    clean = df.loc[~df.suite.isin(OWN_TABLES), [c for c in dict.fromkeys(used) if c in df]]
    return latest_rows(clean, ["machine", "sglang_version", "suite", "case_id"])


def latest_matrix(
    latest: pd.DataFrame,
    suites_dir: Optional[Path] = Path("suites"),
    plans: Optional[dict] = None,
    kept: Optional[Callable[[tuple, Callable[[], list[dict]]], list[dict]]] = None,
) -> pd.DataFrame:
    """``health_matrix`` of the rows ``health_rows`` gave. ``kept(reads, compute)``: how the rows of
    one machine, version and suite are found from all they read (``group_rows``' arguments; the
    dashboard keeps each group's rows under those), else computed."""
    checks = [c for c in latest.columns if c.startswith("check.")]
    rows = []
    plans = dict(plans or {})  # each suite file planned once, not once per version
    for (machine, version, suite), g in latest.groupby(["machine", "sglang_version", "suite"], sort=True):
        if suite not in plans:
            plans[suite] = planned_cells(suites_dir / f"{suite}.toml" if suites_dir else None)
        planned = plans[suite]
        planned = g[MATRIX_KEY + ["topk", "case_id"]] if planned is None else planned
        reads = (machine, version, suite, g, planned, checks)
        rows += group_rows(*reads) if kept is None else kept(reads, lambda reads=reads: group_rows(*reads))
    out = pd.DataFrame(rows)
    if out.empty:
        return out
    topks = sorted((c for c in out.columns if c.startswith("topk ")), key=lambda c: int(c.split()[1]))
    return out[[c for c in out.columns if not c.startswith("topk ")] + topks].fillna("–")


def group_rows(
    machine: str, version: str, suite: str, g: pd.DataFrame, planned: pd.DataFrame, checks: list[str]
) -> list[dict]:
    """The health-matrix rows of one machine, version and suite: ``g`` its latest records,
    ``planned`` the cells its suite file plans (or, without a plan, those recorded)."""
    key = MATRIX_KEY
    rows = []
    # a planned cell's records (as dicts: only the planned cases' ones), found by its key
    recorded: dict[tuple, list[dict]] = {k: [] for k in zip(*(g[c].tolist() for c in key))}
    for r in row_dicts(g[g.case_id.isin(planned.case_id)]):
        recorded[tuple(r[c] for c in key)].append(r)
    for k, plan in planned.groupby(key, sort=True):
        row = dict(
            zip(("machine", "sglang", "suite", "model", "algo", "backend", "page"), (machine, version, suite, *k))
        )
        rec = recorded.get(k)
        for topk, want in plan.groupby("topk"):
            wanted = set(want.case_id)
            got = [r for r in rec or () if r["case_id"] in wanted]  # cases the suite no longer plans: out
            row[f"topk {topk}"] = cell_text(got, len(want), checks) if got else "not run"
        if rec is not None:  # a row with no record at all (e.g. a reduced run of an old version): left out
            rows.append(row)
    return rows


def planned_cells(path: Optional[Path]) -> Optional[pd.DataFrame]:
    """The frame cells (``case_cells``: an own model by its name) and ids of the runnable cases the
    suite file at ``path`` plans; None where there is no such file, it plans nothing runnable or it
    cannot be planned on this host (an own model's checkpoint not here): then the records say what
    was planned."""
    from specwatch.core.errors import SpecwatchInputError
    from specwatch.suite import load_suite

    if not path or not path.exists():
        return None
    try:
        plan = [p.case for p in load_suite(path).plan() if not p.skip and not p.duplicate]
    except SpecwatchInputError:
        return None
    return pd.DataFrame([{**case_cells(c), "case_id": c.case_id} for c in plan]) if plan else None


def cell_text(got: list[dict], planned: int, checks: list[str]) -> str:
    """A health cell: of the ``planned`` cases, how many have an ok latest record (``got``: the
    records, as dicts), then the other statuses, the cases not run and the failed checks, counted."""
    ok = [r for r in got if r["status"] == "ok"]
    bad = [r["status"] for r in got if r["status"] != "ok"]
    issues = [f"{n} {st}" for st, n in pd.Series(bad, dtype=object).astype(str).value_counts().items()] if bad else []
    if (missing := planned - len(got)) > 0:
        issues.append(f"{missing} not run")
    for c in checks:
        failed = [r for r in ok if r[c] == False]  # noqa: E712 (numpy bools, NaN)
        if failed:
            column, what = RELABELS.get(c, (None, None))
            explained = sum(r[column] == True for r in failed) if column in ok[0] else 0  # noqa: E712
            issues.append(
                f"{c[len('check.') :]} ✗ {len(failed)}" + (f" (of which {explained}: {what})" if explained else "")
            )
    return f"{len(ok)}/{planned} ok" + "".join(f"; {i}" for i in issues)


def status_counts(df: pd.DataFrame) -> pd.DataFrame:
    """Records per machine, SGLang version and suite, one column per status."""
    return df.groupby(["machine", "sglang_version", "suite", "status"]).size().unstack(fill_value=0).reset_index()


def throughput_spread(df: pd.DataFrame) -> pd.DataFrame:
    """Decode tokens/s spread within a case's repeats ((max - min) / median) over clean runs (no
    fault, probe on): cases, median and p90 per machine, version, suite, model and batch size."""
    if "decode_throughput_spread" not in df:
        return pd.DataFrame()
    clean = df.decode_throughput_spread.notna() & df.fault.isna() & (df.probe != False)  # noqa: E712
    spread = df[clean].groupby(["machine", "sglang_version", "suite", "model", "batch_size"])
    return (
        spread.agg(
            cases=("decode_throughput_spread", "size"),
            median=("decode_throughput_spread", "median"),
            p90=("decode_throughput_spread", lambda v: v.quantile(0.9)),
        )
        .round(3)
        .reset_index()
    )


def start_phase_medians(df: pd.DataFrame) -> pd.DataFrame:
    """Median engine start time and SGLang's own scheduler startup phases (``start.*`` columns) per
    machine, version and attention backend, over records that have the phases."""
    phases = [c for c in df.columns if c.startswith("start.")]
    if not phases or "engine_start_time" not in df:
        return pd.DataFrame()
    started = df[df[phases].notna().any(axis=1)]
    table = (
        started.groupby(["machine", "sglang_version", "attention_backend"])[["engine_start_time"] + phases]
        .median()
        .round(1)
        .reset_index()
    )
    table.columns = [c.removeprefix("start.") for c in table.columns]
    return table


def failed_checks(df: pd.DataFrame) -> pd.DataFrame:
    """Every record with a failed check: its case id, where it ran (suite, model, backend, page size,
    topk, batch size, e.g. ``smoke tiny triton p64 k4 bs1``), the failed checks by name and what a later
    finding says about them (``RELABELS``), or an empty note."""
    checks = [c for c in df.columns if c.startswith("check.")]
    failing = df[df[checks].eq(False).any(axis=1)] if checks else df.iloc[0:0]
    rows = []
    wanted = ["case_id", "suite", "model", "attention_backend", "page_size", "topk", "batch_size"] + checks
    wanted += [c for c in ("leak_is_unflushed_cache", "row_matches_model_now", "engines_agree_now") if c in failing]
    for row in failing[wanted].to_dict("records"):  # dicts, not a Series per row: thousands at scale
        bad = [c[len("check.") :] for c in checks if row[c] == False]  # noqa: E712 (numpy bools, NaN)
        note = " (the radix cache a refused flush left, not a leak)" if row.get("leak_is_unflushed_cache") else ""
        if "req_to_token_matches_model" in bad and row.get("row_matches_model_now") is True:
            note += " (the row matches today's model: the model's rule was learned later)"
        if AGREE in bad and row.get("engines_agree_now") is True:
            note += " (they agree but for counts over every batch, which timed windows vary)"
        rows.append(
            {
                "case_id": row["case_id"],
                "where": f"{row['suite']} {row['model']} {row['attention_backend']} p{row['page_size']} k{row['topk']} "
                f"bs{row['batch_size']}",
                "failed": bad,
                "note": note,
            }
        )
    return pd.DataFrame(rows, columns=["case_id", "where", "failed", "note"])
