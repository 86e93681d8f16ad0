"""Terminal output of the ``specwatch`` commands: consoles sized by ``COLUMNS`` or the terminal, and
tables that fit them (long headers give way to keys listed under the table, values fold)."""

from __future__ import annotations

import os
import sys
from typing import Optional

from rich.console import Console
from rich.table import Table
from rich.text import Text


def width_for(stderr: bool = False) -> Optional[int]:
    """``COLUMNS`` when set, else a terminal's own width (None: rich asks it); piped output gets
    lines wide enough not to wrap tables."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit():
        return int(columns)
    return None if (sys.stderr if stderr else sys.stdout).isatty() else (200 if stderr else 260)


console = Console(width=width_for())
err_console = Console(stderr=True, width=width_for(stderr=True))


def fit(headers: list[str], cells: list[list[Text]], width: int) -> tuple[list[str], list[Optional[int]]]:
    """Headers and column widths for a table at most ``width`` wide: headers longer than their
    column's values give way to short keys (explained by a legend), then the columns wider than a
    common cap shrink to it (their cells fold onto more lines; the first column only if the rest
    cannot make room) and headers wider than that cap give way to keys too."""
    n = len(headers)
    data = [max((max(len(x) for x in row[i].plain.split("\n")) for row in cells), default=1) for i in range(n)]
    heads, keys, avail = list(headers), short_keys(headers), width - 3 * n - 1  # rich's box: a rule, two pads a column
    natural = [max(len(h), d, 1) for h, d in zip(heads, data)]
    for i in sorted(range(n), key=lambda i: data[i] - len(heads[i])):
        if sum(natural) <= avail:
            return heads, [None] * n
        if len(heads[i]) > max(data[i], len(keys[i])):
            heads[i], natural[i] = keys[i], max(len(keys[i]), data[i], 1)
    if sum(natural) <= avail:
        return heads, [None] * n
    for keep in (natural[0], 0):  # the first column (a case id, a name) stays whole if it can
        cap = max(natural)
        while cap > 4 and keep + sum(min(w, cap) for w in natural[1 if keep else 0 :]) > avail:
            cap -= 1
        widths = [keep or min(natural[0], cap)] + [min(w, cap) for w in natural[1:]]
        if sum(widths) <= avail:
            break
    heads = [keys[i] if len(heads[i]) > widths[i] else heads[i] for i in range(n)]
    return heads, widths


def short_keys(headers: list[str]) -> list[str]:
    """Short distinct keys for headers: their words' initials (``flagged at 5%`` -> ``fa5``)."""
    out: list[str] = []
    for h in headers:
        words = [w for w in h.replace("_", " ").replace("/", " ").replace("-", " ").split() if w[:1].isalnum()]
        key = "".join(w[0] for w in words)[:3].lower() or h[:2]
        k, i = key, 2
        while k in out or (k in headers and k != h):
            k, i = f"{key}{i}", i + 1
        out.append(k)
    return out


def print_table(title: str, headers: list[str], rows: list[list]) -> None:
    """A table that fits the console: no header or cell cut to "…"; abbreviated headers listed below."""
    cells = [[v if isinstance(v, Text) else Text("" if v is None else str(v)) for v in row] for row in rows]
    heads, widths = fit([str(h) for h in headers], cells, console.width)
    t = Table(title=title)
    for h, w in zip(heads, widths):
        t.add_column(h, overflow="fold", width=w)
    for row in cells:
        t.add_row(*row)
    console.print(t)
    legend = [f"{k} = {h}" for k, h in zip(heads, headers) if k != h]
    if legend:
        console.print("; ".join(legend), highlight=False)


def print_frame(title: str, df) -> None:
    print_table(title, list(df.columns), [list(row) for row in df.itertuples(index=False)])
