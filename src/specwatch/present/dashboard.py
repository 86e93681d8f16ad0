"""Static dashboard: ``dashboards/index.html`` opens with the release verdict (newest SGLang release
against the previous one, ``analysis.verdict``) and each suite's health, then a contents list, the
plots and the coverage/health, DCP and fault tables; ``dashboards/cases.html`` holds every case
(sortable, filterable); each comparison report (``dashboards/reports/*.md``) and the DCP tables'
markdown are rendered to HTML beside their markdown. A table too large for the index
(``INLINE_CELLS``) gets pages of its own under ``dashboards/tables/`` (``PAGE_ROWS`` rows each),
linked from its place on the index; ``cases.html`` runs on to ``cases-2.html`` ... past
``CASE_PAGE_ROWS`` rows, so no page grows with the store's history. Pages come from the Jinja2 templates in
``present/templates`` with autoescaping on."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Callable, Optional

import pandas as pd

from specwatch.analysis.dcp import dcp_markdown, dcp_rows, dcp_tables
from specwatch.analysis.health import fault_reads, fault_rows, health_matrix, health_rows, latest_matrix, suite_plans
from specwatch.analysis.overhead import baseline_overhead_reads, baseline_overhead_rows, overhead_reads, overhead_rows
from specwatch.analysis.verdict import ReleaseVerdict
from specwatch.core.errors import SpecwatchInputError
from specwatch.present.figures import PLOT_TITLES, draw_figures
from specwatch.present.markdown_pages import (  # noqa: F401
    ENV,
    markdown_html,
    page_html,
    render_markdown_page,
    render_reports,
    write_markdown_page,
)
from specwatch.present.part_cache import NO_CACHE, PartCache
from specwatch.present.table_view import (  # noqa: F401  (the dashboard's table API, re-exported)
    FOLD_ROWS,
    INLINE_CELLS,
    NOT_MEASURED,
    TableView,
    anchor_of,
    fmt_value,
    sort_key,
    table_view,
)

CASE_COLUMNS = (
    "sglang_version",
    "suite",
    "model",
    "attention_backend",
    "page_size",
    "topk",
    "batch_size",
    "profile",
    "status",
    "decode_throughput",
    "speedup",
    "overhead",
    "overhead_probed_spread",
    "overhead_baseline_spread",
    "overhead_ci_low",
    "overhead_ci_high",
    "overhead_verdict",
    "accept_length",
    "leaked_tokens",
    "lossless_mismatches",
    "req_to_token_bytes",
)
"""Columns of the case table (``cases.html``), those the records frame has."""

PAGE_ROWS = 1_000
"""Rows per page of a table drawn on pages of its own."""

CASE_PAGE_ROWS = 5_000
"""Rows per page of the case table (``cases.html``, then ``cases-2.html``, ...)."""

VERDICT_LINES = 25
"""Most regressed (and most now-failing) cases the verdict lists per suite; the suite's report has all."""

TABLE_DIR = "tables"
"""The folder under the dashboard that holds the tables' own pages."""


def page_name(stem: str, page: int) -> str:
    """The file of a table's ``page``: ``STEM.html``, then ``STEM-2.html``, ..."""
    return f"{stem}.html" if page == 1 else f"{stem}-{page}.html"


def write_pages(views: list[TableView], folder: Path, stem: str, template: str, back: str) -> list[Path]:
    """Each page of one table to ``folder``/``page_name``, with links to all its pages; returns them."""
    folder.mkdir(parents=True, exist_ok=True)
    pager = [(i, page_name(stem, i)) for i in range(1, len(views) + 1)]
    for t in views:
        ENV.get_template(template).stream(table=t, pager=pager, back=back).dump(str(folder / page_name(stem, t.page)))
    return [folder / name for _, name in pager]


def remove_stale_pages(folder: Path, pattern: str, written: list[Path]) -> None:
    """The pages matching ``pattern`` in ``folder`` that this build did not write (a previous build's
    pages past the last one, or of a table now small enough for the index): the dashboard folder
    is this command's own output."""
    for old in folder.glob(pattern):
        if old not in written:
            old.unlink()


def section_views(
    titled: list[tuple[str, pd.DataFrame, str]], out: Path, parts: PartCache = NO_CACHE
) -> list[TableView]:
    """The index's tables (title, frame, anchor) as drawn there, and those too large for it
    (``TableView.own_page``) on pages of their own under ``out/TABLE_DIR``, each page linking back
    to the table's place on the index; a table's pages are kept in ``parts`` under its title,
    anchor and frame (``PartCache.files``), written again from their bytes while those are
    unchanged. A previous build's pages no table wrote are removed."""
    views, written = [], []
    for title, t, anchor in titled:
        view = TableView(title, anchor, [str(c) for c in t.columns], length=len(t))  # the index's link
        if not view.own_page:
            views.append(table_view(title, t, anchor))
            continue

        def draw(folder: Path, title=title, t=t, anchor=anchor) -> list[Path]:
            return write_pages(
                table_view(title, t, anchor).split(PAGE_ROWS),
                folder,
                anchor,
                "table.html.j2",
                f"../index.html#{anchor}",
            )

        written += parts.files(
            f"table-{anchor}", out / TABLE_DIR, draw, lambda title=title, t=t, anchor=anchor: (title, t, anchor)
        )
        views.append(view)
    if (out / TABLE_DIR).exists():
        remove_stale_pages(out / TABLE_DIR, "*.html", written)
    return views


def cases_table(df: pd.DataFrame) -> TableView:
    """Every clean case record, one row each, sorted by suite, backend, page and topk."""
    cols = [c for c in CASE_COLUMNS if c in df]
    return table_view("Cases", df.sort_values(["suite", "attention_backend", "page_size", "topk"])[cols], "cases")


def recorded_counts(df: pd.DataFrame) -> pd.DataFrame:
    """Records per machine, SGLang version and suite, one column per status."""
    return df.groupby(["machine", "sglang_version", "suite", "status"]).size().unstack(fill_value=0).reset_index()


def section_tables(
    df: pd.DataFrame,
    faults: pd.DataFrame,
    overhead: pd.DataFrame,
    dcp: dict,
    tables: Optional[dict[str, pd.DataFrame]],
    health: Optional[pd.DataFrame] = None,
    baseline_overhead: Optional[pd.DataFrame] = None,
) -> list[tuple[str, pd.DataFrame, str]]:
    """The index's tables after the plots, in order: health matrix (``health``, where already
    made), DCP tables per DCP suite, fault injection, harness overhead against the plain loop
    (``baseline_overhead``, rounds pooled over runs) and against bare runs, recorded counts, then
    ``tables``, as (title, frame, anchor); empty ones left out."""
    titled = [
        (
            "Coverage and health per suite (latest record of each case; rows with no record left out; "
            "DCP and faults have tables of their own)",
            health_matrix(df) if health is None else health,
            "health",
        )
    ]
    for suite, (summary, matrix) in dcp.items():
        titled += [
            (
                f"DCP support summary (suites/{suite}.toml, folded over page size and topk)",
                summary,
                f"dcp-summary-{suite}",
            ),
            (f"DCP support matrix (suites/{suite}.toml)", matrix, f"dcp-matrix-{suite}"),
        ]
    titled += [
        ("Fault injection (specwatch inject)", faults, "faults"),
        (
            "Harness overhead against the plain loop (specwatch run --baseline, rounds pooled over runs)",
            baseline_overhead,
            "baseline-overhead",
        ),
        ("Harness overhead (specwatch run --bare)", overhead, "overhead"),
        ("Recorded cases per machine, SGLang version and suite", recorded_counts(df), "recorded"),
    ]
    titled += [(title, t, None) for title, t in (tables or {}).items()]
    return [(title, t, anchor or anchor_of(title)) for title, t, anchor in titled if t is not None and not t.empty]


def dcp_part(rows: pd.DataFrame, md: Path) -> tuple[dict, Optional[tuple[str, str]]]:
    """The DCP tables of the records ``rows`` (``dcp_tables``) and, where there are any, their
    page ``md``: (markdown, HTML)."""
    dcp = dcp_tables(rows)
    text = dcp_markdown(dcp) if dcp else None
    return dcp, None if text is None else (text, page_html(md, text, "index.html"))


def health_part(df: pd.DataFrame, plans: dict, parts: PartCache) -> pd.DataFrame:
    """``health_matrix`` of the clean records ``df``, kept under the latest records it reads
    (``health_rows``) and the suite files' ``plans``, and each machine, version and suite's rows
    under what they read (a record of one suite leaves the other suites' rows kept)."""

    def group(reads: tuple, compute) -> list[dict]:
        name = hashlib.sha256(repr(reads[:3]).encode()).hexdigest()[:24]
        return parts.read_value(f"health-{name}", reads, compute)

    def matrix(read: tuple) -> pd.DataFrame:
        rows, plans = read
        return pd.DataFrame() if rows is None else latest_matrix(rows, plans=plans, kept=group)

    reads = lambda: (health_rows(df) if not df.empty else None, plans)  # noqa: E731
    return parts.kept("health", reads, matrix, also=plans)


def health_anchor(suite: str, dcp: dict) -> str:
    """Where a suite's own table is on the index page."""
    if suite in dcp:
        return f"dcp-summary-{suite}"
    return "faults" if suite == "faults" else "health"


def check_records(df: pd.DataFrame, out: Path, source: Optional[Path]) -> None:
    """Raise where the frame holds no record: then no dashboard file is written."""
    if df.empty:
        raise SpecwatchInputError(source, f"no records: the dashboard in {out} is left as it is")


def clean_records(df: pd.DataFrame) -> pd.DataFrame:
    """The records shown everywhere but the fault and overhead tables: no fault, not a bare run."""
    return df[clean_mask(df)]  # one mask, one copy


def clean_mask(df: pd.DataFrame) -> pd.Series:
    """Per row of ``df``, whether ``clean_records`` keeps it."""
    keep = df.fault.isna() if "fault" in df else pd.Series(True, index=df.index)
    if "probe" in df:
        keep &= df.probe != False  # noqa: E712
    return keep


def record_pages(clean: pd.DataFrame, out: Path) -> list[Path]:
    """The pages drawn from the clean records ``clean`` and the folder alone: ``out/cases.html``
    (then ``cases-2.html`` ..., a previous build's pages past the last removed; each page streamed
    to its file) and each report's HTML (``render_reports``); returns the reports' markdown files."""
    cases = write_pages(cases_table(clean).split(CASE_PAGE_ROWS), out, "cases", "cases.html.j2", "index.html")
    remove_stale_pages(out, "cases-[0-9]*.html", cases)
    return render_reports(out)


def build(
    df: pd.DataFrame,
    out: Path,
    tables: Optional[dict[str, pd.DataFrame] | Callable[[], dict[str, pd.DataFrame]]] = None,
    verdict: Optional[ReleaseVerdict | Callable[[], Optional[ReleaseVerdict]]] = None,
    source: Optional[Path] = None,
    figures: Optional[Callable[[], list[Path]]] = None,
    clean: Optional[pd.DataFrame] = None,
    parts: PartCache = NO_CACHE,
    pages: Optional[Callable[[], list[Path]]] = None,
    dcp: Optional[Callable[[], tuple[dict, Optional[tuple[str, str]]]]] = None,
) -> Path:
    """Write ``out/index.html``, ``out/cases.html``, the plots and the reports' HTML; returns the index.
    ``tables``: further titled tables (roofline, sweep cost) shown last, or the call that returns
    them (called once the case pages are written); ``verdict``: the release verdict the page opens
    with (``analysis.verdict.release_verdict``), or the call that returns it (called last); ``source``: the results root the frame was read
    from (named when it holds no record: then nothing is written); ``figures``: the call that
    returns the figures' files (default: ``draw_figures`` of the clean records into ``out/plots``),
    called last (the figures can be drawn elsewhere meanwhile: ``core.forked``); ``clean``: the
    caller's ``clean_records(df)``, where it has them; ``parts``: where the tables derived from
    the records are kept between builds (``part_cache``; ``df`` is then that store's frame);
    ``pages``: the call that writes the case pages and the reports' HTML (``record_pages`` of the
    clean records, the default), called before the index is written; ``dcp``: the call that
    returns the DCP tables and their page (``dcp_part`` of the clean records' DCP rows, kept in
    ``parts``, the default)."""
    check_records(df, out, source)
    faults = parts.kept("faults", lambda: fault_reads(df), fault_rows)  # kept under the rows they read
    overhead = parts.kept("overhead", lambda: overhead_reads(df), overhead_rows)
    pooled = parts.kept("baseline-overhead", lambda: baseline_overhead_reads(df), baseline_overhead_rows)
    df = clean_records(df) if clean is None else clean
    if dcp is None:  # the DCP tables read the DCP suites' records only: kept while those are unchanged
        dcp = lambda: parts.rows_value("dcp", dcp_rows(df), lambda rows: dcp_part(rows, out / "dcp-support.md"))  # noqa: E731
    dcp, dcp_page = dcp()
    out.mkdir(parents=True, exist_ok=True)
    if dcp:
        write_markdown_page(out / "dcp-support.md", dcp_page)
    plans = suite_plans(df)  # the suite files today (and the checkpoints here) decide what was planned
    health = health_part(df, plans, parts)
    titled = section_tables(df, faults, overhead, dcp, tables() if callable(tables) else tables, health, pooled)
    sections = section_views(titled, out, parts)
    drawn = figures() if figures is not None else draw_figures(df, out / "plots")
    plots = [p.stem for p in drawn if p.suffix == ".png"]
    reports = pages() if pages is not None else record_pages(df, out)
    index = out / "index.html"
    page = ENV.get_template("index.html.j2").stream(
        verdict=verdict() if callable(verdict) else verdict,
        plots=[(n, PLOT_TITLES.get(n, n)) for n in plots],
        table_dir=TABLE_DIR,
        page_rows=PAGE_ROWS,
        list_limit=VERDICT_LINES,
        sections=sections,
        reports=[r.stem for r in reports],
        report_names={r.stem for r in reports},
        dcp=bool(dcp),
        health_anchor=lambda s: health_anchor(s, dcp),
        asv=(out / "asv" / "index.html").exists(),
        cases=len(df),
    )
    page.dump(str(index))
    return index
