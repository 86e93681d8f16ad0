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

import math
import re
from dataclasses import dataclass, field
from numbers import Number
from pathlib import Path
from typing import Callable, Optional

import pandas as pd
from markupsafe import Markup, escape
from pandas.api.types import infer_dtype

from specwatch.analysis.dcp import DCP_SUITES, dcp_markdown, dcp_matrix, dcp_summary
from specwatch.analysis.health import fault_table, health_matrix
from specwatch.analysis.overhead import overhead_table
from specwatch.analysis.verdict import ReleaseVerdict
from specwatch.core.errors import SpecwatchInputError
from specwatch.present.figures import PLOT_TITLES, draw_figures
from specwatch.present.markdown_pages import ENV, markdown_html, render_markdown_page, render_reports  # noqa: F401

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
    "accept_length",
    "leaked_tokens",
    "lossless_mismatches",
    "req_to_token_bytes",
)
"""Columns of the case table (``cases.html``), those the records frame has."""

NOT_MEASURED = "–"
"""What a table cell shows where the record holds no value."""

FOLD_ROWS = 60
"""Tables longer than this start folded (``<details>``), their row count in the summary."""

INLINE_CELLS = 8_000
"""Most cells (rows x columns) a table shows on the index; a larger one is linked there and drawn
on pages of its own (``tables/<anchor>.html``, ``tables/<anchor>-2.html``, ...)."""

PAGE_ROWS = 1_000
"""Rows per page of a table drawn on pages of its own."""

CASE_PAGE_ROWS = 5_000
"""Rows per page of the case table (``cases.html``, then ``cases-2.html``, ...)."""

VERDICT_LINES = 25
"""Most regressed (and most now-failing) cases the verdict lists per suite; the suite's report has all."""

TABLE_DIR = "tables"
"""The folder under the dashboard that holds the tables' own pages."""


def fmt_value(v) -> str:
    """A cell's text: thousands separators, at most 3 decimals, never scientific notation;
    ``NOT_MEASURED`` for a missing value (None, NaN)."""
    if v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NA or v is pd.NaT:
        return NOT_MEASURED
    if isinstance(v, bool) or not isinstance(v, Number):
        return str(v)
    if float(v).is_integer():
        return f"{int(v):,}"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    decimals = 1 if abs(v) >= 100 else 3 if abs(v) >= 0.001 else 9
    return f"{v:.{decimals}f}".rstrip("0").rstrip(".")


def sort_key(v) -> str:
    """A cell's sort value for the page's sorter: the number itself, '' when not measured."""
    if isinstance(v, Number) and not isinstance(v, bool) and not (isinstance(v, float) and math.isnan(v)):
        return repr(float(v))
    return ""


@dataclass
class TableView:
    """A frame as the templates draw it: titled, its cells formatted (``fmt_value``), kept column
    by column (a large store's tables hold millions of cells: no per-row lists are made to draw them)."""

    title: str
    anchor: str
    columns: list[str]
    cells: list[list[tuple[str, str]]] = field(default_factory=list)
    """Per column, per row: (text, numeric sort value or '')."""
    numeric: list[bool] = field(default_factory=list)
    """Per column: True when it holds a number (its cells align right)."""
    length: int = 0
    """This view's rows."""

    page: int = 1
    """This view's page of its table (1: the first or only one)."""
    pages: int = 1
    """How many pages its table is drawn on."""
    total_rows: int = -1
    """Rows of the whole table (-1: this view's own rows)."""

    @property
    def rows(self) -> list[list[tuple[str, str]]]:
        """Per row, per column: (text, numeric sort value or '')."""
        return [list(row) for row in zip(*self.cells)] if self.cells else [[] for _ in range(self.length)]

    @property
    def folded(self) -> bool:
        return self.length > FOLD_ROWS

    @property
    def row_count(self) -> int:
        """Rows of the whole table, over all its pages."""
        return self.length if self.total_rows < 0 else self.total_rows

    @property
    def own_page(self) -> bool:
        """True when the table is too large for the index (``INLINE_CELLS``)."""
        return self.length * max(1, len(self.columns)) > INLINE_CELLS

    def split(self, rows_per_page: int) -> list["TableView"]:
        """The table cut into pages of ``rows_per_page`` rows (one page when it fits)."""
        n = max(1, -(-self.length // rows_per_page))
        return [
            TableView(
                self.title,
                self.anchor,
                self.columns,
                [col[i * rows_per_page : (i + 1) * rows_per_page] for col in self.cells],
                self.numeric,
                min(rows_per_page, max(0, self.length - i * rows_per_page)),
                i + 1,
                n,
                self.length,
            )
            for i in range(n)
        ]

    def html_rows(self) -> list[Markup]:
        """Each row as its ``<tr>`` (cells escaped; a number's cell right-aligned, a status cell
        classed by its text, a sortable cell carrying its sort value)."""
        return [Markup(row) for row in self._tr()]

    def html_body(self) -> Markup:
        """The table's ``<tbody>`` content: each row's ``<tr>`` (``html_rows``) and a newline."""
        return Markup("".join(f"{row}\n" for row in self._tr()))

    def _tr(self) -> list[str]:
        """The rows' ``<tr>`` texts, built column by column in Python (each distinct cell of a
        column drawn once): a template loop over every cell took most of a large store's page time."""
        status = self.columns.index("status") if "status" in self.columns else -1
        drawn = []
        for i, column in enumerate(self.cells):  # per column: each distinct cell's markup, once
            tds = {}
            for cell in dict.fromkeys(column):
                text, key = cell
                shown = escape(text)
                cls = ' class="num"' if self.numeric[i] else f' class="st st-{shown}"' if i == status else ""
                value = f' data-v="{escape(key)}"' if key else ""
                tds[cell] = f"<td{cls}{value}>{shown}</td>"
            drawn.append(map(tds.__getitem__, column))
        if not drawn:
            return ["<tr></tr>" for _ in range(self.length)]
        return ["<tr>" + "".join(cells) + "</tr>" for cells in zip(*drawn)]


def anchor_of(title: str) -> str:
    """An id for a section: the title's words, lower case, joined by '-'."""
    return "-".join(re.findall(r"[a-z0-9]+", title.lower()))[:60]


def table_view(title: str, df: pd.DataFrame, anchor: Optional[str] = None) -> TableView:
    """``df`` (index dropped) as a ``TableView``; cells are formatted column by column, each
    distinct value of a column once (a large store's columns repeat a few values)."""
    columns = [_column_cells(df.iloc[:, i]) for i in range(len(df.columns))]
    numeric = [any(key for _, key in dict.fromkeys(cells)) for cells in columns]
    return TableView(title, anchor or anchor_of(title), [str(c) for c in df.columns], columns, numeric, len(df))


def _column_cells(column: pd.Series) -> list[tuple[str, str]]:
    """(text, sort value) of each cell of one column (missing values as None); typed or text only:
    factorized."""
    negative_zero = column.dtype.kind == "f" and ((column == 0) & (1 / column < 0)).any()  # factorize: 0.0
    text = column.dtype == object and infer_dtype(column, skipna=True) == "string"  # str or missing only
    if (column.dtype != object or text) and not negative_zero:
        codes, uniques = pd.factorize(column, use_na_sentinel=True)  # each distinct value formatted once
        cells = [(fmt_value(v), sort_key(v)) for v in pd.Series(uniques, dtype=column.dtype).astype(object)]
        return [cells[i] if i >= 0 else (NOT_MEASURED, "") for i in codes.tolist()]  # -1: missing
    seen: dict = {}
    out = []
    for v in column.astype(object).where(column.notna(), None):
        key = (float, repr(v)) if isinstance(v, float) else (type(v), v)  # -0.0 apart from 0.0
        try:
            cell = seen[key]
        except KeyError:
            cell = seen[key] = (fmt_value(v), sort_key(v))
        except TypeError:  # unhashable (a list): formatted each time
            cell = (fmt_value(v), sort_key(v))
        out.append(cell)
    return out


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


def table_pages(sections: list[TableView], out: Path) -> None:
    """The index's tables too large for it (``TableView.own_page``) on pages of their own under
    ``out/TABLE_DIR``, each page linking back to the table's place on the index."""
    written = []
    for t in sections:
        if t.own_page:
            back = f"../index.html#{t.anchor}"
            written += write_pages(t.split(PAGE_ROWS), out / TABLE_DIR, t.anchor, "table.html.j2", back)
    if (out / TABLE_DIR).exists():
        remove_stale_pages(out / TABLE_DIR, "*.html", written)


def cases_table(df: pd.DataFrame) -> TableView:
    """Every clean case record, one row each, sorted by suite, backend, page and topk."""
    cols = [c for c in CASE_COLUMNS if c in df]
    return table_view("Cases", df.sort_values(["suite", "attention_backend", "page_size", "topk"])[cols], "cases")


def recorded_counts(df: pd.DataFrame) -> pd.DataFrame:
    """Records per machine, SGLang version and suite, one column per status."""
    return df.groupby(["machine", "sglang_version", "suite", "status"]).size().unstack(fill_value=0).reset_index()


def section_tables(
    df: pd.DataFrame, faults: pd.DataFrame, overhead: pd.DataFrame, dcp: dict, tables: Optional[dict[str, pd.DataFrame]]
) -> list[TableView]:
    """The index's tables after the plots, in order: health matrix, DCP tables per DCP suite, fault
    injection, harness overhead, recorded counts, then ``tables``; empty ones left out."""
    titled = [
        (
            "Coverage and health per suite (latest record of each case; rows with no record left out; "
            "DCP and faults have tables of their own)",
            health_matrix(df),
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
        ("Harness overhead (specwatch run --bare)", overhead, "overhead"),
        ("Recorded cases per machine, SGLang version and suite", recorded_counts(df), "recorded"),
    ]
    titled += [(title, t, None) for title, t in (tables or {}).items()]
    return [table_view(title, t, anchor) for title, t, anchor in titled if t is not None and not t.empty]


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


def build(
    df: pd.DataFrame,
    out: Path,
    tables: Optional[dict[str, pd.DataFrame] | Callable[[], dict[str, pd.DataFrame]]] = None,
    verdict: Optional[ReleaseVerdict | Callable[[], Optional[ReleaseVerdict]]] = None,
    source: Optional[Path] = None,
    figures: Optional[Callable[[], list[Path]]] = None,
    clean: Optional[pd.DataFrame] = None,
) -> Path:
    """Write ``out/index.html``, ``out/cases.html``, the plots and the reports' HTML; returns the index.
    ``tables``: further titled tables (roofline, sweep cost) shown last, or the call that returns
    them (called once the case pages are written); ``verdict``: the release verdict the page opens
    with (``analysis.verdict.release_verdict``), or the call that returns it (called last); ``source``: the results root the frame was read
    from (named when it holds no record: then nothing is written); ``figures``: the call that
    returns the figures' files (default: ``draw_figures`` of the clean records into ``out/plots``),
    called last (the figures can be drawn elsewhere meanwhile: ``core.forked``); ``clean``: the
    caller's ``clean_records(df)``, where it has them."""
    check_records(df, out, source)
    faults, overhead = fault_table(df), overhead_table(df)
    df = clean_records(df) if clean is None else clean
    dcp = {suite: (dcp_summary(m), m) for suite in DCP_SUITES if not (m := dcp_matrix(df, suite)).empty}
    out.mkdir(parents=True, exist_ok=True)
    if dcp:
        (out / "dcp-support.md").write_text(dcp_markdown(dcp))
        render_markdown_page(out / "dcp-support.md", "index.html")
    reports = render_reports(out)
    report_names = {r.stem for r in reports}
    # pages streamed to their files; the large tables get pages of their own
    cases = write_pages(cases_table(df).split(CASE_PAGE_ROWS), out, "cases", "cases.html.j2", "index.html")
    remove_stale_pages(out, "cases-[0-9]*.html", cases)
    sections = section_tables(df, faults, overhead, dcp, tables() if callable(tables) else tables)
    table_pages(sections, out)
    drawn = figures() if figures is not None else draw_figures(df, out / "plots")
    plots = [p.stem for p in drawn if p.suffix == ".png"]
    index = out / "index.html"
    page = ENV.get_template("index.html.j2").stream(
        verdict=verdict() if callable(verdict) else verdict,
        plots=[(n, PLOT_TITLES.get(n, n)) for n in plots],
        table_dir=TABLE_DIR,
        page_rows=PAGE_ROWS,
        list_limit=VERDICT_LINES,
        sections=sections,
        reports=[r.stem for r in reports],
        report_names=report_names,
        dcp=bool(dcp),
        health_anchor=lambda s: health_anchor(s, dcp),
        asv=(out / "asv" / "index.html").exists(),
        cases=len(df),
    )
    page.dump(str(index))
    return index
