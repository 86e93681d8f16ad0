"""Selections as records-frame rows: ``select``'s FIELD=VALUE rules over the cached frame of only
the files a selection can match, with only the columns a comparison reads (no record is parsed
on a warm cache)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

from specwatch.core.errors import SpecwatchInputError
from specwatch.store.frame import COMPARE_COLUMN, files_frame
from specwatch.store.jsonl import result_files
from specwatch.store.select import parse_terms, selected_files

if TYPE_CHECKING:
    import pandas as pd

SELECT_COLUMNS = [
    "case_id",
    "status",
    "finished_at",
    "started_at",
    "run_id",
    "host_interference",
    "machine",
    "sglang_version",
    "sglang_commit",
    "specwatch_commit",
    "suite",
    "fault",
    "probe",
    "overlap_starts",
    "model",
    "batch_size",
    COMPARE_COLUMN,
]
"""The frame columns ``select_rows`` reads: the selection fields, the latest rule's and compare's."""


def field_values(df: "pd.DataFrame", key: str) -> "pd.Series":
    """Per row, the text ``select.SELECT_FIELDS[key]`` gives for its record."""
    import pandas as pd

    def text(col: str) -> pd.Series:
        return pd.Series([str(v) if v is not None and v == v else "None" for v in df[col]], index=df.index)

    if key == "fault":
        return pd.Series([v if isinstance(v, str) and v else "none" for v in df.fault], index=df.index)
    if key in ("probe", "overlap"):
        col = df.probe if key == "probe" else df.overlap_starts
        return pd.Series(["on" if v is True or v == True else "off" for v in col], index=df.index)  # noqa: E712
    if key == "run":
        commits = text("specwatch_commit")
        return pd.Series(
            [r if isinstance(r, str) and r else f"commit:{c}" for r, c in zip(df.run_id, commits)], index=df.index
        )
    return text(key)


def newest_run_rows(df: "pd.DataFrame", n: int, spec: str) -> str:
    """``select.newest_run`` over frame rows: the n-th newest run by its first record's start."""
    firsts = df.started_at.groupby(field_values(df, "run"), sort=False).min()
    runs = list(firsts.sort_values(kind="mergesort").index)
    if not 1 <= n <= len(runs):
        raise SpecwatchInputError(None, f"run -{n}: the selection holds {len(runs)} run(s)", field=spec)
    return runs[-n]


def selection_files(spec: str, root: Path) -> list[Path]:
    """The results files ``select_rows(spec, root)`` reads: the file or folder ``spec`` names, else
    those under ``root`` that can hold a record the selection keeps (``select.selected_files``)."""
    p = Path(spec)
    if p.exists():
        return [p] if p.is_file() else result_files(p)
    return selected_files(root, parse_terms(spec))


def select_rows(spec: str, root: Path, columns: Optional[list[str]] = None) -> "pd.DataFrame":
    """``select(spec, root)`` as frame rows (``columns``, by default ``SELECT_COLUMNS``, which
    the selection needs), in the order ``select`` gives its records; the same terms, defaults
    (clean, probed, not overlapped unless named) and errors."""
    columns = SELECT_COLUMNS if columns is None else columns
    df = files_frame(selection_files(spec, root), columns=columns)
    if Path(spec).exists() or df.empty:
        return df
    terms = parse_terms(spec)
    named = {key for key, _, _ in terms}
    for key, default in (("fault", "none"), ("probe", "on"), ("overlap", "off")):
        if key not in named:
            df = df[field_values(df, key) == default]
    for key, negate, value in sorted(terms, key=lambda t: t[0] == "run"):  # run=-N counts within the rest
        if key == "run" and value.startswith("-") and value[1:].isdigit():
            value = newest_run_rows(df, int(value[1:]), spec)
        df = df[field_values(df, key).isin(set(value.split("|"))) != negate]
    return df
