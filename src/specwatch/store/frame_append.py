"""A results file's cached rows carried over to the file grown by lines appended since.

Where the JSONL still begins with the bytes its Parquet cache (``frame_cache``) was built from
(the cached size, its sha256, ending at a line's end) and today's row code built the cache, only
the appended lines are turned into rows, and they are joined to the cached ones column by column
under the dtype the whole file's rows are given when built at once (``joined_dtype``: pandas'
inference over every value of the column). A tail that would give a column a dtype these rules do
not name (a new column, text in a numeric column) has the whole file built again instead.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

from specwatch.store.frame_cache import cache_meta, cache_path, cached_frame, prefix_of
from specwatch.store.jsonl import Quarantine

if TYPE_CHECKING:
    import pandas as pd

    Build = Callable[[Path, tuple, bool], tuple[pd.DataFrame, list[str]]]

EXACT_INTS = 2**53
"""Integers a float64 holds exactly: an integer column is joined to a float one only below this."""


def appended_rows(path: Path, key: Optional[dict], build: "Build") -> Optional[tuple["pd.DataFrame", list[str]]]:
    """(the rows of ``path`` as built whole, the lines quarantined) found from its cache of an
    earlier, shorter state of the file and the lines appended since, or None where the cache is
    not of a prefix of today's file (or today's code) or the rows cannot be joined: then the file
    is built whole. ``key``: the file's ``frame_cache.source_key`` now; ``build(path, span,
    strict)``: the rows and quarantined lines of a byte span (``store.frame``)."""
    cache = cache_path(path)
    meta = cache_meta(cache) if key is not None else None
    if meta is None:
        return None
    built = meta["key"]
    size = built.get("size")
    if built.get("code") != key["code"] or not isinstance(size, int) or not 0 < size < key["size"]:
        return None
    prefix = prefix_of(path, size)
    if prefix is None or prefix.sha256 != built.get("sha256") or not prefix.ends_line:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the cached lines are warned about by the caller
        old = cached_frame(cache, meta, Quarantine(), hidden=True)
    if old is None:
        return None
    tail, entries = build(path, (size, key["size"], prefix.lines + 1), False)  # no further than hashed
    rows = join_rows(old, tail)
    return None if rows is None else (rows, [*meta["quarantined"], *entries])


def join_rows(old: "pd.DataFrame", tail: "pd.DataFrame") -> Optional["pd.DataFrame"]:
    """The rows ``old`` (a cache's, read back) followed by ``tail`` (built from the lines after
    them), each column under ``joined_dtype``; None where a column cannot be joined so, or the
    tail holds a column ``old`` lacks (the column order of a whole build would differ)."""
    import pandas as pd

    if not len(tail):
        return old  # no valid line appended: the rows are the cached ones
    if not len(old) or not set(tail.columns) <= set(old.columns):
        return None
    left, right = {}, {}
    for c in old.columns:
        a, b = old[c], tail[c] if c in tail else None
        dtype = joined_dtype(
            a.dtype, null_kind(a), None if b is None else b.dtype, "nan" if b is None else null_kind(b)
        )
        if dtype is None:
            return None
        left[c], right[c] = cast(a, dtype, len(a)), cast(b, dtype, len(tail))
        if left[c] is None or right[c] is None:
            return None
    joined = pd.concat([pd.DataFrame(left), pd.DataFrame(right)], ignore_index=True, sort=False)
    return joined if all(joined[c].dtype == left[c].dtype for c in old.columns) else None


def null_kind(column: "pd.Series") -> Optional[str]:
    """How a column holds no value at all: ``"none"`` (an object column of None only), ``"nan"``
    (a float column of NaN only); None where it holds a value."""
    if _is_object(column.dtype) and column.isna().all() and all(v is None for v in column.tolist()):
        return "none"
    if column.dtype.kind == "f" and column.isna().all():
        return "nan"
    return None


def joined_dtype(a, a_null: Optional[str], b, b_null: Optional[str]):
    """The dtype pandas infers for a column of the values of two columns of dtypes ``a`` and ``b``
    (``b`` None: the tail lacks the column, so its rows hold NaN) with their ``null_kind``s, or
    None for a pair these rules do not name. A column of no value takes the other's dtype, but an
    integer one then holds floats and a bool one objects; None and NaN alone give float; int and
    float give float; an object column with any other of these stays object; datetimes of one
    unit and zone stay so (a cache's zone object is not the built one's)."""
    import numpy as np

    if a_null and b_null:
        return np.dtype(object) if a_null == b_null == "none" else np.dtype("float64")
    if a_null or b_null:
        other = b if a_null else a
        if other.kind in "fMO":  # "str": kind O
            return other
        return np.dtype("float64") if other.kind == "i" else np.dtype(object) if other.kind == "b" else None
    if a == b or (a.kind == b.kind == "M" and str(a) == str(b)):  # one zone, two objects for it
        return a
    if {a.kind, b.kind} == {"i", "f"}:
        return np.dtype("float64")
    if (_is_object(a) or _is_object(b)) and all(t.kind in "ifbO" for t in (a, b)):  # "str": kind O
        return np.dtype(object)
    return None


def cast(column: Optional["pd.Series"], dtype, n: int) -> Optional["pd.Series"]:
    """``column`` (None: ``n`` rows of no value) as ``dtype``, its values kept (integers only
    where a float holds them exactly); None where it cannot be."""
    import numpy as np
    import pandas as pd

    if column is not None and column.dtype == dtype:
        return column.reset_index(drop=True)
    if column is not None and column.dtype.kind == dtype.kind == "M" and str(column.dtype) == str(dtype):
        return column.astype(dtype).reset_index(drop=True)  # the same zone (as read back, as built)
    if column is None or null_kind(column):
        if _is_object(dtype):
            return pd.Series([None] * n, dtype=object)
        return pd.Series(pd.array([None] * n, dtype=dtype)) if dtype.kind in "fM" or str(dtype) == "str" else None
    if dtype.kind == "f" and column.dtype.kind == "i":
        exact = column.abs().max() < EXACT_INTS
        return column.astype(np.float64).reset_index(drop=True) if exact else None
    if _is_object(dtype):
        return column.astype(object).reset_index(drop=True)
    return None


def _is_object(dtype) -> bool:
    """Whether ``dtype`` is numpy's object dtype (pandas' ``str`` is not, though of kind O too)."""
    import numpy as np

    return isinstance(dtype, np.dtype) and dtype.kind == "O"
