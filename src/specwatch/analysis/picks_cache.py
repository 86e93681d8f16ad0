"""A cache of one results file's change-point picks (``changepoints.file_picks``: each case's latest
clean row per release, its compare cell decoded to the samples of the metrics asked for), beside
the JSONL (``FILE.jsonl.picks.parquet``).

The picks are used only while the JSONL's file-system stamp (``frame_cache.stamp_of``: size,
modification and change times, inode, device) is the one they were built from, by today's row code
(``frame_cache.code_key``) and change-point code (``CODE_FILES``), for the same metrics; any write
to the JSONL moves its change time, so a changed file is picked again (and its cache rewritten). A
store that cannot be written is read without this cache.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

from specwatch.store.frame_cache import code_key, sources_digest, stamp_of, write_parquet

if TYPE_CHECKING:
    import pandas as pd

SUFFIX = ".picks.parquet"
"""Appended to the JSONL's name: ``smoke.jsonl`` -> ``smoke.jsonl.picks.parquet``."""

META_KEY = b"specwatch.picks_cache"
"""Parquet schema metadata key holding what the picks were built from."""

_ANALYSIS = Path(__file__).resolve().parent
CODE_FILES = [
    _ANALYSIS / "changepoints.py",
    _ANALYSIS / "picks_cache.py",
    _ANALYSIS.parent / "store" / "latest.py",
]
"""Sources that pick and decode the rows (besides the row code): picks built by other code are rebuilt."""


def picks_code_key() -> str:
    """sha256 over the row code's key and ``CODE_FILES``."""
    return sources_digest(tuple(CODE_FILES), code_key())


def cache_path(path: Path) -> Path:
    return Path(path).with_name(Path(path).name + SUFFIX)


def _key(path: Path, metrics: Optional[list[str]], cell: str) -> Optional[dict]:
    """What picks of ``path`` must have been built from; None where the JSONL cannot be read."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return {"stamp": stamp_of(st), "code": picks_code_key(), "metrics": metrics, "cell": cell}


def cached_picks(
    path: Path, metrics: Optional[list[str]], cell: str, pick: Callable[[], "pd.DataFrame"], raw: bool = False
) -> "pd.DataFrame":
    """The picks of ``path`` from its cache where that is fresh, else ``pick()`` (then cached);
    ``cell``: the picks' column of decoded cells (stored as JSON text); ``raw``: that column left
    as the JSON text (``decoded_cells`` decodes it), as stored."""
    import orjson

    key = _key(path, metrics, cell)
    if key is not None and (hit := _read(cache_path(path), key, cell, raw)) is not None:
        return hit
    picks = pick()
    if key is not None and key == _key(path, metrics, cell):  # the file did not change meanwhile
        _write(cache_path(path), picks, key, cell)
    if raw and cell in picks.columns:
        picks = picks.assign(**{cell: [orjson.dumps(v).decode() for v in picks[cell]]})
    return picks


def decoded_cells(picks: "pd.DataFrame", cell: str) -> "pd.DataFrame":
    """Picks read ``raw`` (``cached_picks``) with their ``cell`` column decoded, as read otherwise."""
    import orjson

    return picks.assign(**{cell: [orjson.loads(v) for v in picks[cell]]}) if cell in picks.columns else picks


def _read(cache: Path, key: dict, cell: str, raw: bool = False) -> Optional["pd.DataFrame"]:
    import pyarrow.parquet as pq

    try:
        schema = pq.read_schema(cache)
        if json.loads((schema.metadata or {})[META_KEY]) != key:
            return None
        df = pq.ParquetFile(cache).read().to_pandas()
    except (OSError, KeyError, ValueError):
        return None
    return df if raw else decoded_cells(df, cell)


def _write(cache: Path, picks: "pd.DataFrame", key: dict, cell: str) -> None:
    """Write the cache atomically; any failure (read-only store, a column Arrow cannot type)
    leaves none: the next read picks the rows again."""
    import orjson

    out = picks.reset_index(drop=True)
    if cell in out.columns:
        out[cell] = [orjson.dumps(v).decode() for v in out[cell]]
    write_parquet(cache, out, META_KEY, json.dumps(key))
