"""The measured findings as markdown (``dashboards/findings.md``), computed from a records frame.

Every claim names the records behind it by record id (``store.latest.record_id``). Each case is
judged by its latest record (``store.latest.latest_rows``) per machine, SGLang version, suite and
fault. Sections: smoke and reduced tree-page health and the req_to_token row width across SGLang
versions; fault injection per version; DFLASH per version; SGLang's refusals (skipped cases).
"""

from __future__ import annotations

from collections import Counter
from typing import Callable, Optional

import pandas as pd

from specwatch.core.record import Status
from specwatch.inject.stalls import NULL_SLOWDOWNS, SLOW_VERIFY
from specwatch.store.latest import latest_rows, record_id

IDENTITY = ["machine", "sglang_version", "suite", "case_id", "fault"]
"""Columns naming one case's records: the latest of each group is the one judged."""

SHOWN_IDS = 3
"""Record ids listed after a count of records that all say the same (the rest counted)."""

TREE_PAGE_REDUCED = {"attention_backend": "triton", "topk": 8}
"""The reduced tree-page sweep: its records run on every SGLang version."""

ROW_WIDTH_AT = {"page_size": 64, "topk": 4}
"""Where the req_to_token row width is compared across versions."""

WATERMARK_CHECK = "check.decode_watermark_page_aligned"
"""The check that DFLASH's decode watermark covers whole pages."""


SECTION_COLUMNS = ("started_at", "finished_at", "run_id", "host_interference", "status", "reason", "probe")
SECTION_COLUMNS += ("fault_code_runs", "req_to_token_row_width", "algorithm", "attention_backend", "page_size")
"""The columns the sections read besides ``IDENTITY`` and the checks (the latest rows are cut from these only)."""


def _ids(rows: pd.DataFrame, limit: int | None = None) -> str:
    """Record ids of ``rows`` in order, backquoted; past ``limit``, the rest counted."""
    ids = [record_id(c, t) for c, t in zip(rows.case_id, rows.started_at)]
    shown = ids if limit is None else ids[:limit]
    more = f" and {len(ids) - len(shown)} more" if len(ids) > len(shown) else ""
    return ", ".join(f"`{i}`" for i in shown) + more


def _version_key(v: str) -> tuple:
    """SGLang versions in release order (0.5.9 before 0.5.12)."""
    return tuple(int(p) if p.isdigit() else p for p in str(v).split("."))


def _versions(df: pd.DataFrame) -> list[str]:
    return sorted(df.sglang_version.dropna().unique(), key=_version_key)


def _bad_checks(rows: pd.DataFrame) -> list[list[str]]:
    """Per row of ``rows``, the checks it failed."""
    checks = [c for c in rows.columns if c.startswith("check.")]
    failed = [[v == False for v in rows[c]] for c in checks]  # noqa: E712 (numpy bools, NaN)
    return [[c[len("check.") :] for c, col in zip(checks, failed) if col[i]] for i in range(len(rows))]


def _ok_line(rows: pd.DataFrame) -> str:
    """ "ok/total" of ``rows``, the ids of those not ok after it."""
    bad = rows[rows.status != Status.ok.value]
    text = f"{len(rows) - len(bad)}/{len(rows)} ok"
    return text + (f" (not ok: {_ids(bad)})" if len(bad) else "")


def latest_records(df: pd.DataFrame) -> pd.DataFrame:
    """Each case's latest record per machine, version, suite and fault, probed runs only (bare runs
    measure the harness, not SGLang), sorted by version, suite and start."""
    if df.empty:
        return df
    df = df.assign(fault=df.fault if "fault" in df else None)
    if "probe" in df:
        df = df[df.probe != False]  # noqa: E712
    picked = latest_rows(df, IDENTITY)
    return picked.sort_values(["machine", "sglang_version", "suite", "started_at", "case_id"], kind="mergesort")


def _where(df: pd.DataFrame, **values) -> pd.DataFrame:
    """Rows of ``df`` whose columns equal ``values`` (no such column: none)."""
    mask = pd.Series(True, index=df.index)
    for col, v in values.items():
        mask &= df[col] == v if col in df else False
    return df[mask]


def versions_section(latest: pd.DataFrame) -> list[str]:
    """Smoke and reduced tree-page health, and the req_to_token row width at page 64 topk 4, per
    machine and SGLang version (clean runs)."""
    out = [
        "## Across SGLang versions",
        "",
        "| machine | SGLang | smoke | tree-page (triton, topk 8) | req_to_token row width (page 64, topk 4) |",
        "|---|---|---|---|---|",
    ]
    clean = latest[latest.fault.isna()]
    for machine in sorted(clean.machine.unique()):
        on = clean[clean.machine == machine]
        for v in _versions(on):
            rows = on[on.sglang_version == v]
            smoke, tree = rows[rows.suite == "smoke"], _where(rows[rows.suite == "tree-page"], **TREE_PAGE_REDUCED)
            if smoke.empty and tree.empty:
                continue
            width = _where(rows, **ROW_WIDTH_AT)
            widths = ""
            if "req_to_token_row_width" in width:  # a store without a measured row has no such column
                width = width[width.req_to_token_row_width.notna()]
                groups = width.groupby("req_to_token_row_width")
                widths = "; ".join(f"{int(w):,} ({len(g)}: {_ids(g, SHOWN_IDS)})" for w, g in groups)
            cells = [_ok_line(smoke) if len(smoke) else "–", _ok_line(tree) if len(tree) else "–", widths or "–"]
            out.append(f"| {machine} | {v} | " + " | ".join(cells) + " |")
    return out + [""]


def faults_section(latest: pd.DataFrame) -> list[str]:
    """Per SGLang version and fault: records, how many were caught and by what, how many never ran
    the faulted code, and the clean twins' status."""
    out = ["## Faults", ""]
    faulty = latest[latest.fault.notna()]
    if faulty.empty:
        return out + ["No fault-injection records.", ""]
    for v in _versions(faulty):
        out.append(f"### SGLang {v}")
        out.append("")
        for fault in sorted(faulty[faulty.sglang_version == v].fault.unique()):
            rows = faulty[(faulty.sglang_version == v) & (faulty.fault == fault)]
            out += [f"- **{fault}**: {len(rows)} records", *_fault_lines(rows, latest)]
            if fault in NULL_SLOWDOWNS:
                out.append(
                    "  - the null fault (no time added): nothing to catch; with the clean pass interleaved in one "
                    f"run, `specwatch noise` of a clean run against `fault={fault}` prices the floor"
                )
            elif fault in SLOW_VERIFY:
                out.append(
                    "  - a planted slowdown: no check catches it by design; `specwatch compare` of a clean run "
                    f"against `fault={fault}` judges its timed metrics against the class's floor"
                )
        out.append("")
    return out


def _fault_lines(rows: pd.DataFrame, latest: pd.DataFrame) -> list[str]:
    """The lines under one fault of one version: caught by what, missed, faulted code not run, twins."""
    by: Counter = Counter()
    caught, missed = [], []
    for name_, status, bad in zip(rows.index, rows.status, _bad_checks(rows)):
        if status != Status.ok.value:
            by[status] += 1
        for name in bad:
            by[name] += 1
        (caught if status != Status.ok.value or bad else missed).append(name_)
    runs = rows.fault_code_runs if "fault_code_runs" in rows else pd.Series(float("nan"), index=rows.index)
    lines = [
        f"  - caught: {len(caught)}" + (f" (by {', '.join(f'{k} {n}' for k, n in sorted(by.items()))})" if by else "")
    ]
    if missed:
        lines.append(f"  - not caught: {len(missed)} ({_ids(rows.loc[missed])})")
    zero, uncounted = rows[runs == 0], rows[runs.isna()]
    if len(zero):
        lines.append(f"  - faulted code ran 0 times: {len(zero)} ({_ids(zero)})")
    if len(uncounted):
        lines.append(f"  - faulted code runs not counted: {len(uncounted)} ({_ids(uncounted, SHOWN_IDS)})")
    twins = latest[  # each column's distinct values: ``isin`` converts what it is given to Python values
        latest.fault.isna()
        & (latest.machine.isin(rows.machine.unique()))
        & (latest.sglang_version.isin(rows.sglang_version.unique()))
        & (latest.suite.isin(rows.suite.unique()))
        & latest.case_id.isin(rows.case_id.unique())
    ]
    dirty = twins[
        (twins.status != Status.ok.value) | pd.Series([bool(b) for b in _bad_checks(twins)], index=twins.index)
    ]
    twin = f"{len(twins) - len(dirty)}/{len(twins)} ok with every check passing"
    lines.append(f"  - clean twins: {twin}" + (f" (not clean: {_ids(dirty)})" if len(dirty) else ""))
    return lines


def dflash_section(latest: pd.DataFrame) -> list[str]:
    """DFLASH per SGLang version: ok/total per backend, exact acceptance and lossless counts, and
    the records failing the page-aligned decode watermark check."""
    out = [
        "## DFLASH",
        "",
        "SGLang 0.5.17 sizes the DFLASH decode watermark inline without rounding it up to whole pages; "
        "0.5.19 computes it in `allocation_sizing.page_aligned_decode_alloc_lens`. "
        f"`{WATERMARK_CHECK[len('check.') :]}` judges it at page > 1.",
        "",
    ]
    d = latest[latest.fault.isna() & (latest.algorithm == "DFLASH")] if "algorithm" in latest else latest[:0]
    if d.empty:
        return out + ["No DFLASH records.", ""]
    for v in _versions(d):
        rows = d[d.sglang_version == v]
        out += [f"### SGLang {v}", ""]
        for backend, g in rows.groupby("attention_backend"):
            out.append(f"- {backend}: {_ok_line(g)}")
        out += [_check_count(rows, "check.accept_length_matches_oracle", "acceptance exact")]
        out += [_check_count(rows, "check.lossless", "lossless")]
        if WATERMARK_CHECK in rows:
            failing = rows[rows[WATERMARK_CHECK] == False]  # noqa: E712
            passing = rows[rows[WATERMARK_CHECK] == True]  # noqa: E712
            pages = ", ".join(str(int(p)) for p in sorted(failing.page_size.unique()))
            out.append(
                f"- decode watermark page-aligned: {len(passing)} pass, {len(failing)} fail"
                + (f" (pages {pages}: {_ids(failing)})" if len(failing) else "")
            )
        out.append("")
    return out


def _check_count(rows: pd.DataFrame, check: str, label: str) -> str:
    """ "label: passed/judged" of one check over ``rows``, the failing ids after it."""
    if check not in rows:
        return f"- {label}: not judged"
    judged = rows[rows[check].notna()]
    failing = judged[judged[check] == False]  # noqa: E712
    return f"- {label}: {len(judged) - len(failing)}/{len(judged)}" + (
        f" (failing: {_ids(failing)})" if len(failing) else ""
    )


def refusals_section(latest: pd.DataFrame) -> list[str]:
    """SGLang's refusals per version: each skipped reason, how many records, one example id."""
    out = ["## SGLang refusals (skipped cases)", ""]
    skipped = latest[latest.status == Status.skipped.value]
    if skipped.empty:
        return out + ["No skipped records.", ""]
    for v in _versions(skipped):
        out += [f"### SGLang {v}", "", "| records | reason | example |", "|---|---|---|"]
        rows = skipped[skipped.sglang_version == v]
        counts = rows.reason.fillna("").value_counts(sort=False)
        for reason in sorted(counts.index, key=lambda r: (-counts[r], r)):
            example = rows[rows.reason.fillna("") == reason].iloc[:1]
            out.append(f"| {counts[reason]} | {reason.replace('|', '/')} | {_ids(example)} |")
        out.append("")
    return out


def findings_markdown(frame: pd.DataFrame) -> str:
    """The findings page of a records frame (``store.frame.files_frame``): each section computed
    from the latest records (``latest_records``), each claim with its record ids."""
    return latest_markdown(findings_rows(frame))


def findings_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """All ``findings_markdown`` reads of a records frame: the latest records of the columns its
    sections read."""
    used = {*IDENTITY, *SECTION_COLUMNS, *TREE_PAGE_REDUCED, *ROW_WIDTH_AT}
    return latest_records(frame[[c for c in frame.columns if c in used or str(c).startswith("check.")]])


def latest_markdown(
    latest: pd.DataFrame, section: Optional[Callable[[Callable, pd.DataFrame], list[str]]] = None
) -> str:
    """``findings_markdown`` of the rows ``findings_rows`` gave; each section drawn from its own
    reads of them (``SECTIONS``), by ``section(draw, reads)`` where given (the dashboard keeps
    each section under its reads), else ``draw(reads)``."""
    lines = [
        "# Measured findings",
        "",
        "Computed by `specwatch dashboard` from the results store: each case judged by its latest record. "
        "A record id is `<case_id>@<started_at, UTC, YYYYMMDDTHHMMSSZ>`.",
        "",
    ]
    if latest.empty:
        return "\n".join(lines + ["No records.", ""])
    for draw, reads in SECTIONS:
        rows = reads(latest)
        lines += draw(rows) if section is None else section(draw, rows)
    return "\n".join(lines)


def versions_reads(latest: pd.DataFrame) -> pd.DataFrame:
    """All ``versions_section`` reads of the latest rows: the clean smoke and tree-page rows and
    those where the row width is compared (``ROW_WIDTH_AT``)."""
    width = pd.Series(True, index=latest.index)
    for col, v in ROW_WIDTH_AT.items():
        width &= latest[col] == v if col in latest else False
    return latest[latest.fault.isna() & (latest.suite.isin(["smoke", "tree-page"]) | width)]


def faults_reads(latest: pd.DataFrame) -> pd.DataFrame:
    """All ``faults_section`` reads of the latest rows: the fault runs and the clean runs of their cases."""
    faulted = latest.fault.notna()
    return latest[faulted | latest.case_id.isin(latest.case_id[faulted].unique())]


def dflash_reads(latest: pd.DataFrame) -> pd.DataFrame:
    """All ``dflash_section`` reads of the latest rows: the clean DFLASH ones."""
    return latest[latest.fault.isna() & (latest.algorithm == "DFLASH")] if "algorithm" in latest else latest[:0]


def refusals_reads(latest: pd.DataFrame) -> pd.DataFrame:
    """All ``refusals_section`` reads of the latest rows: the skipped ones."""
    return latest[latest.status == Status.skipped.value]


SECTIONS = (
    (versions_section, versions_reads),
    (faults_section, faults_reads),
    (dflash_section, dflash_reads),
    (refusals_section, refusals_reads),
)
"""The findings' sections in order, each with what it reads of the latest rows (it draws the
same lines from those as from all of them)."""
