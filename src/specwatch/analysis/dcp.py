"""The DCP support matrix: per configuration, whether SGLang ran it, refused it or crashed, and the pools' facts."""

from __future__ import annotations

import math
import re
from typing import Callable, Optional

import pandas as pd

from specwatch.core.case import CASE_FIELDS, OWN_PARAMS, Case
from specwatch.oracle.prompts import starts_behind_digest
from specwatch.rules.crashlog import WORKER_DIED_RE
from specwatch.rules.validity import skip_reason
from specwatch.store.frame import latest_rows
from specwatch.store.row_case import derived_case_id, is_own_row

DCP_SUITES = ("dcp", "dcp-large")
"""Suites whose records make a DCP support matrix: ``dcp`` (tp 2) and ``dcp-large`` (tp 4 and 8)."""


def dcp_matrix(df: pd.DataFrame, suite: str = "dcp") -> pd.DataFrame:
    """DCP support matrix: one row per engine configuration of a DCP suite (``DCP_SUITES``; latest
    record per case and SGLang version) with its status or SGLang's reason, acceptance against the oracle,
    lossless mismatches, whether each KV pool covers every slot the allocator hands out (seed 004),
    and, for dcp > 1, whether the greedy outputs equal those of the same case at dcp 1 (the two
    share prompts by construction). Built column by column (``matrix_columns``)."""
    if df.empty or "dcp" not in df or "suite" not in df:
        return pd.DataFrame()
    d = df.loc[df.suite == suite, [c for c in MATRIX_COLUMNS if c in df]]  # only the columns read
    if d.empty:
        return pd.DataFrame()
    d = latest_rows(d, ["sglang_version", "case_id"])
    d = d.sort_values(["model", "algorithm", "attention_backend", "page_size", "topk", "workload", "dcp"])
    cols = {str(c): d[c].tolist() for c in d.columns if c not in ORDER_ONLY}  # check.* are not attribute names
    return pd.DataFrame(matrix_columns(cols, len(d)))


def dcp_tables(df: pd.DataFrame) -> dict[str, tuple[pd.DataFrame, pd.DataFrame]]:
    """Per DCP suite (``DCP_SUITES``) with records in ``df``: (its ``dcp_summary``, its ``dcp_matrix``)."""
    return {suite: (dcp_summary(m), m) for suite in DCP_SUITES if not (m := dcp_matrix(df, suite)).empty}


def dcp_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The part of ``df`` that ``dcp_tables`` reads: the DCP suites' rows, ``MATRIX_COLUMNS``
    (``dcp_tables`` of it is ``dcp_tables`` of ``df``)."""
    if "suite" not in df:
        return pd.DataFrame()
    return df.loc[df.suite.isin(DCP_SUITES), [c for c in MATRIX_COLUMNS if c in df]]


ORDER_ONLY = ("started_at", "finished_at", "run_id")
"""``MATRIX_COLUMNS`` that only ``latest_rows`` reads: not made Python values."""


MATRIX_COLUMNS = list(
    dict.fromkeys(
        [
            *CASE_FIELDS,
            *OWN_PARAMS,  # an own model's row (``store.row_case``)
            "serving_prompts",
            *("suite", "case_id", "sglang_version", "status", "reason", "host_interference"),
            *("started_at", "finished_at", "run_id"),  # latest_rows' order
            *("accept_length", "check.accept_length_matches_oracle", "lossless_mismatches", "peak_token_usage"),
            *("check.target_pool_covers_allocator", "check.draft_pool_covers_allocator"),
            *("probe_read_attention_backend", "allocator_page_size", "draft_pool_page_mismatch"),
            *(f"{role}_pool_{k}" for role in ("target", "draft") for k in ("page_size", "valid_end", "needed_end")),
            *("draft_pool_missing_rows", "calibrated_input_len", "output_digest", "prompt_starts", "timed_repeats"),
        ]
    )
)
"""The records-frame columns a matrix row reads (``matrix_row``, ``twin_outputs``) and ``latest_rows`` orders by."""


def matrix_columns(cols: dict[str, list], n: int) -> dict[str, list]:
    """The matrix's columns from the ``n`` sorted rows' columns ``cols`` (name -> values). A row is
    made a dict (``row``) only where a crash is read against the validity rules or an ok dcp > 1
    case looks for its twin; the other cells are made column by column."""
    get = lambda name: cols.get(name, [None] * n)  # noqa: E731 - a column the frame lacks: all None
    cells = lambda name: [None if v is None or (isinstance(v, float) and math.isnan(v)) else v for v in get(name)]  # noqa: E731
    rows: dict[int, dict] = {}

    def row(i: int) -> dict:
        if i not in rows:
            rows[i] = {name: values[i] for name, values in cols.items()}
        return rows[i]

    by_id = {key: i for i, key in enumerate(zip(cols["sglang_version"], cols["case_id"]))}
    status, dcp = cols["status"], cols["dcp"]
    mismatch = cells("draft_pool_page_mismatch")
    return {
        "sglang": cols["sglang_version"],
        "model": cols["model"],
        "algo": cols["algorithm"],
        "backend": cols["attention_backend"],
        "page": cols["page_size"],
        "topk": cols["topk"],
        "tp": cols["tp"],
        "dcp": dcp,
        "workload": cols["workload"],
        "lengths": [f"{a}→{b}" for a, b in zip(cols["input_len"], cols["output_len"])],
        "outcome": outcome_column(cols, cells("host_interference"), row),
        "accept length": accept_column(cells("accept_length"), cells("check.accept_length_matches_oracle")),
        "lossless mismatches": cells("lossless_mismatches"),
        "peak token usage": cells("peak_token_usage"),
        "pools cover allocator": cover_column(
            cells("check.target_pool_covers_allocator"),
            cells("check.draft_pool_covers_allocator"),
            dcp,
            cells("probe_read_attention_backend"),
        ),
        "allocator page": cells("allocator_page_size"),
        "target pool": pool_column(*(cells(f"target_pool_{k}") for k in POOL_FIELDS)),
        "draft pool": pool_column(*(cells(f"draft_pool_{k}") for k in POOL_FIELDS)),
        # seed 004's flag: the draft pool paged other than the allocator (in the pool's slot space)
        "draft_pool_page_mismatch": ["" if m is None else ("YES" if m else "no") for m in mismatch],
        "draft pool missing rows": cells("draft_pool_missing_rows"),
        "same outputs as dcp 1": [
            "" if dcp[i] <= 1 or status[i] != "ok" else same_outputs(row(i), by_id, row) for i in range(n)
        ],
    }


POOL_FIELDS = ("page_size", "valid_end", "needed_end")
"""A KV pool's facts (``{role}_pool_{field}`` columns) its matrix cell shows."""


def outcome_column(cols: dict[str, list], interference: list, row: Callable[[int], dict]) -> list[str]:
    """Each row's ``ok``, or its status with SGLang's reason; a crash at start in the words of a
    validity rule reads as the skip that rule gives, and a case the host disturbed as not measured."""
    out = []
    for i, (status, reason, disturbed) in enumerate(zip(cols["status"], cols["reason"], interference)):
        outcome = status if status == "ok" else f"{status}: {str(reason)[:160]}"
        if status == "crashed" and (case := case_of(row(i))) is not None:
            rule = skip_reason(case)
            if rule and rule.split(": ", 1)[-1] in str(reason):
                # SGLang refused it at start with the words of a rule specwatch learnt since: a skip
                outcome = f"skipped: {rule} (SGLang refused it at start; recorded crashed before the rule)"
        if disturbed:
            outcome = f"not measured (host interference): {cols['host_interference'][i]}"
        out.append(outcome)
    return out


def same_outputs(r: dict, by_id: dict[tuple, int], row: Callable[[int], dict]) -> str:
    """For an ok dcp > 1 case, how its greedy outputs compare with its dcp-1 twin's (``twin_outputs``);
    ``by_id``: the suite's row numbers by (SGLang version, case id)."""
    i = by_id.get((r["sglang_version"], derived_case_id(r, lambda c: c.model_copy(update={"dcp": 1}))))
    twin = None if i is None else row(i)
    if twin is None or twin["status"] != "ok":
        return "no dcp 1 run" if twin is None else f"dcp 1 {twin['status']}"
    return twin_outputs(r, twin)


def cover_column(target: list, draft: list, dcp: list, read_backend: list) -> list[str]:
    """Whether each KV pool (target, draft) covers every slot the allocator hands out: yes / NO."""
    out = []
    for covers, d, read in zip(zip(target, draft), dcp, read_backend):
        text = ", ".join("yes" if c else "NO" for c in covers if c is not None)
        if text and d > 1 and read is False:
            # an older probe: the target pool was taken as sharded per rank whatever the backend does
            text += " (target judged as sharded: probe predates the backend check)"
        out.append(text)
    return out


def accept_column(accept: list, matches: list) -> list[str]:
    """The acceptance length, with whether it equals the oracle's."""
    marks = {True: " (= oracle)", False: " (≠ oracle)"}
    return ["" if al is None else f"{al:.3f}" + marks.get(m, "") for al, m in zip(accept, matches)]


def pool_column(page: list, valid: list, needed: list) -> list[str]:
    """A KV pool's page and where its valid slots end, of where the allocator's last page ends in the
    pool's slot space (seed 004: "valid to X of Y" with X < Y is a pool the allocator overruns)."""
    return [
        "" if p is None else f"page {int(p)}, valid to {int(v)} of {int(e)}" for p, v, e in zip(page, valid, needed)
    ]


def case_of(r: dict) -> Optional[Case]:
    """The case of a records-frame row (a dict); None for an own model's, whose row holds no
    checkpoint (the validity rules that read one cannot judge it)."""
    return None if is_own_row(r) else Case(**{f: r[f] for f in CASE_FIELDS})


def cell(r: dict, name: str):
    """A record row's value, None where the frame has none (NaN)."""
    v = r.get(name)
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else v


def _prompt_starts(r: dict) -> Optional[list]:
    """A record's timed chain starts: recorded, or (older records) reproduced from its output digest."""
    starts = r.get("prompt_starts")
    if isinstance(starts, list):
        return starts
    reps, digest = cell(r, "timed_repeats"), cell(r, "output_digest")
    if cell(r, "lossless_mismatches") != 0 or not digest or reps is None:
        return None
    case = case_of(r)
    if case is None:  # an own model: no oracle chain to replay
        return None
    key = (case.case_id, cell(r, "calibrated_input_len") or case.input_len, int(reps), digest)
    if key not in _STARTS:
        _STARTS[key] = starts_behind_digest(case, key[1], key[2], digest)
    return _STARTS[key]


_STARTS: dict[tuple, Optional[list]] = {}
"""(case id, input length, repeats, output digest) -> ``starts_behind_digest``'s answer, found once
(the oracle replays every chain of the case)."""


def twin_outputs(r: dict, twin: dict) -> str:
    """Whether a dcp > 1 record's greedy outputs equal its dcp-1 twin's. The two share prompts by
    construction, unless near-full calibration lengthened each to its own pool or the two ran under
    different prompt draws of specwatch; then each is judged by the oracle (lossless) instead."""
    lossless = cell(r, "lossless_mismatches") == 0 and cell(twin, "lossless_mismatches") == 0
    if cell(r, "calibrated_input_len") != cell(twin, "calibrated_input_len"):
        # each engine lengthened its near-full prompts to its own pool: the outputs cannot match,
        # but each is checked token by token against the oracle chain of its own prompts
        return "prompts calibrated apart; both lossless" if lossless else "DIFFERENT"
    if cell(r, "output_digest") and r["output_digest"] == twin.get("output_digest"):
        return "identical"
    if lossless:
        mine, theirs = _prompt_starts(r), _prompt_starts(twin)
        if mine is not None and theirs is not None and mine != theirs:
            return "prompts drawn apart (specwatch's draw changed between the runs); both lossless"
    return "DIFFERENT"


ASSERTION_LINES_RE = re.compile(r"(failed) \(\d+ l.*$")  # "... failed (288 lines of it in the log); surfaced as ..."


def crash_cause(outcome: str) -> str:
    """An outcome as a summary names its cause: without the worker's exit prefix, the count of
    assertion lines in that run's log and what the assertion surfaced as (they vary run to run)."""
    return ASSERTION_LINES_RE.sub(r"\1", WORKER_DIED_RE.sub("", outcome))[:140]


def dcp_summary(matrix: pd.DataFrame) -> pd.DataFrame:
    """The DCP support matrix folded over page size and topk: one row per SGLang version, tp, model,
    algorithm and backend; per (dcp, workload, prompt→output lengths) how many cases ran ok out of those that were not
    skipped by SGLang's own rules, with the distinct failure causes, and how many dcp > 1 cases
    gave greedy outputs identical to their dcp-1 twins."""
    if matrix.empty:
        return pd.DataFrame()
    rows = []
    lead = ["sglang", "tp", "model", "algo", "backend"]
    for key, g in matrix.groupby(lead, sort=True):
        row = dict(zip(lead, key))
        cells: dict[tuple, list[str]] = {}  # (dcp, workload, lengths) -> outcomes, grouped in Python:
        for group, outcome in zip(zip(g.dcp, g.workload, g.lengths), g.outcome):  # a large store has
            if not any(pd.isna(v) for v in group):  # thousands of one-row groups
                cells.setdefault(group, []).append(outcome)
        for (dcp, workload, lengths), outcomes in cells.items():
            row[f"dcp {dcp} {workload} {lengths}"] = summary_cell(outcomes)
        same = g.loc[g.dcp > 1, "same outputs as dcp 1"]
        compared = same[same.isin(["identical", "DIFFERENT"])]
        apart = int(same.str.startswith("prompts drawn apart").sum())
        parts = [f"{int((compared == 'identical').sum())}/{len(compared)} identical"] if not compared.empty else []
        parts += [f"{apart} on prompts drawn apart (both lossless)"] if apart else []
        row["outputs = dcp 1"] = "; ".join(parts) or ("no ok dcp-1 twin" if (same != "").any() else "")
        rows.append(row)
    out = pd.DataFrame(rows)
    return out[
        lead + sorted(c for c in out.columns if c not in lead and c != "outputs = dcp 1") + ["outputs = dcp 1"]
    ].fillna("not run")


MARKDOWN_ROWS = 500
"""Rows of a DCP table ``dcp_markdown`` writes; the rest are counted in a line under it (the
dashboard's index page holds every row)."""

MARKDOWN_COLUMNS = 60
"""Columns of a DCP table ``dcp_markdown`` writes (a summary gains one per dcp, workload and
lengths); the rest are counted in a line under it (the index page's table holds every column)."""


def summary_cell(outcomes: list[str]) -> str:
    """A DCP summary cell: of one group's matrix outcomes, how many ran ok out of those not
    skipped by rule, the distinct failure causes, and the cases not measured or skipped."""
    unmeasured = sum(o.startswith("not measured") for o in outcomes)
    skipped = sum(o.startswith("skipped") for o in outcomes)
    ran = [o for o in outcomes if not o.startswith("skipped") and not o.startswith("not measured")]
    if not ran:
        return f"{unmeasured} not measured (host interference)" if unmeasured else "all skipped by rule"
    causes = sorted({crash_cause(o) for o in ran if o != "ok"})
    return (
        f"{sum(o == 'ok' for o in ran)}/{len(ran)} ok"
        + "".join(f"; {c}" for c in causes)
        + (f"; {unmeasured} more not measured (host interference)" if unmeasured else "")
        + (f"; {skipped} more skipped by rule" if skipped else "")
    )


def dcp_markdown(tables: dict[str, tuple[pd.DataFrame, pd.DataFrame]]) -> str:
    """The DCP support summaries and matrices (suite -> (summary, matrix)) as markdown
    (``dashboards/dcp-support.md``, readable where the HTML dashboard is not served): generated from
    the store, so no count in it is typed by hand. A table over ``MARKDOWN_ROWS`` rows or
    ``MARKDOWN_COLUMNS`` columns is cut there, with a line saying how many rows and columns the
    index page's table has beyond it."""

    def md(t: pd.DataFrame) -> str:
        text = (
            t.iloc[:MARKDOWN_ROWS, :MARKDOWN_COLUMNS]
            .astype(str)
            .replace({r"\|": r"\\|", "\n": " ", "^nan$": "", "^None$": ""}, regex=True)
            .to_markdown(index=False)
        )
        more = [
            f"{n:,} more {what}"
            for n, what in ((len(t) - MARKDOWN_ROWS, "rows"), (t.shape[1] - MARKDOWN_COLUMNS, "columns"))
            if n > 0
        ]
        if more:
            text += f"\n\n{' and '.join(more)}: see the table on the dashboard's index page"
        return text

    names = ", ".join(f"`suites/{suite}.toml`" for suite in tables)
    versions = ", ".join(sorted({v for _, m in tables.values() for v in m.sglang.unique()}))
    parts = [
        f"# DCP support ({names})\n\nWritten by `specwatch dashboard` from `results/` "
        f"(SGLang {versions}); each case's latest record.\n"
    ]
    for suite, (summary, matrix) in tables.items():
        parts.append(
            f"\n## Summary, folded over page size and topk (`suites/{suite}.toml`)\n\n{md(summary)}\n"
            f"\n## Matrix (`suites/{suite}.toml`)\n\n{md(matrix)}\n"
        )
    return "".join(parts)
