"""A frame as the dashboard's templates draw it (``TableView``): titled, each cell formatted
(``fmt_value``) with its sort value, kept column by column, cut into pages where it is too large
for the index (``INLINE_CELLS``)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from numbers import Number
from typing import Optional

import pandas as pd
from markupsafe import Markup, escape
from pandas.api.types import infer_dtype

NOT_MEASURED = "–"
"""What a table cell shows where the record holds no value."""

FOLD_ROWS = 60
"""Tables longer than this start folded (``<details>``), their row count in the summary."""

INLINE_CELLS = 8_000
"""Most cells (rows x columns) a table shows on the index; a larger one is linked there and drawn
on pages of its own (``tables/<anchor>.html``, ``tables/<anchor>-2.html``, ...)."""


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
