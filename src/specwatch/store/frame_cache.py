"""A Parquet cache of one results file's frame rows, beside it (``FILE.jsonl.parquet``).

The JSONL stays the source of truth: a cache is used only while the JSONL's size, modification
time and sha256, and the code that turns records into rows (``CODE_FILES``), are those it was
built from; otherwise it is rebuilt. The sha256 is read again only where the file system's stamp
of the JSONL (size, times, inode: ``stamp_of``) is not the one it had when hashed. A store that
cannot be written (read-only) is read without a cache. Columns holding lists or dicts are stored as JSON text and read back as lists and dicts;
the lines the build quarantined are kept with the cache and reported again on each hit.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    import pandas as pd
from specwatch.store.jsonl import Quarantine

SUFFIX = ".parquet"
"""Appended to the JSONL's name: ``smoke.jsonl`` -> ``smoke.jsonl.parquet``."""

META_KEY = b"specwatch.frame_cache"
"""Parquet schema metadata key holding what the cache was built from."""

_PKG = Path(__file__).resolve().parents[1]
CODE_FILES = [
    _PKG / "store" / "frame.py",
    _PKG / "store" / "frame_cache.py",
    _PKG / "store" / "baseline.py",
    _PKG / "core" / "record.py",
    _PKG / "core" / "details.py",
    _PKG / "core" / "migrations.py",
    _PKG / "core" / "case.py",
    *sorted((_PKG / "rules").glob("*.py")),
]
"""Sources whose change changes the rows: a cache built by other code is rebuilt."""


@functools.lru_cache(maxsize=None)
def sources_digest(files: tuple[Path, ...], seed: str = "") -> str:
    """sha256 over ``seed`` and the bytes of ``files``, in order (computed once per process): the
    code part of a cache's key, so a cache built by other code is rebuilt."""
    h = hashlib.sha256(seed.encode())
    for f in files:
        h.update(f.read_bytes())
    return h.hexdigest()


def code_key() -> str:
    """sha256 over ``CODE_FILES``."""
    return sources_digest(tuple(CODE_FILES))


def cache_path(path: Path) -> Path:
    return Path(path).with_name(Path(path).name + SUFFIX)


_digests: Optional[dict[tuple, str]] = None
"""Within ``one_pass``: (path, size, mtime, ctime, inode) -> the file's sha256, hashed once."""


@contextmanager
def one_pass():
    """A command that reads the store several times (the dashboard: its frame, the verdict's and
    the floor's selections, the change points) hashes each file once inside this block: a file
    whose size, times and inode are unchanged is taken as unchanged. Outside it every read hashes."""
    global _digests
    outer, _digests = _digests, {} if _digests is None else _digests
    try:
        yield
    finally:
        _digests = outer


def _sha256(path: Path, st: os.stat_result) -> str:
    seen = (str(Path(path).resolve()), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
    if _digests is not None and seen in _digests:
        return _digests[seen]
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    if _digests is not None:
        _digests[seen] = h.hexdigest()
    return h.hexdigest()


def source_key(path: Path) -> dict:
    """What a cache of ``path`` must have been built from: size, mtime, sha256, row code, and
    (``stamp``, not compared) the file's ``stamp_of`` as hashed."""
    st = os.stat(path)
    key = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": _sha256(path, st), "code": code_key()}
    return {**key, STAMP: stamp_of(st)}


STAMP = "stamp"
"""The key's entry holding the JSONL's ``stamp_of`` when it was hashed: the one entry not compared."""


def stamp_of(st: os.stat_result) -> list[int]:
    """What the file system says of a file without reading it: size, modification and change
    times (ns), inode and device. Any write moves the change time, which no caller can set back."""
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


def fresh_rows(
    path: Path, quarantine: Quarantine, columns: Optional[list[str]] = None
) -> tuple[Optional["pd.DataFrame"], Optional[dict]]:
    """(the cached rows of ``path`` or None where no fresh cache exists, the key a new cache is
    built under, None where the JSONL cannot be read). ``columns``: only those the cache has are
    read; None: all but the hidden ones (named with a leading ``_``). A cache whose stamp
    (``stamp_of``) is the JSONL's now, built by today's row code, is read without hashing the
    JSONL (the file is the one it was built from); otherwise the sha256 decides."""
    try:
        st = os.stat(path)
    except OSError:
        return None, None  # unreadable: the build reports it
    cache = cache_path(path)
    if (hit := _read(cache, None, quarantine, columns, stamp_of(st))) is not None:
        return hit, None
    try:
        key = source_key(path)
    except OSError:
        return None, None
    return _read(cache, key, quarantine, columns), key


def store_rows(path: Path, df: "pd.DataFrame", key: Optional[dict], quarantined: list[str]) -> None:
    """Cache ``df`` as the rows of ``path`` built under ``key`` (None: not cached)."""
    if key is not None:
        _write(cache_path(path), df, key, quarantined)


def _read(
    cache: Path,
    key: Optional[dict],
    quarantine: Quarantine,
    columns: Optional[list[str]] = None,
    stamp: Optional[list[int]] = None,
):
    """The cached rows when built under ``key`` (its ``STAMP`` aside) or, with ``stamp`` instead,
    from a file of that stamp by today's row code; else None."""
    import pyarrow.parquet as pq

    try:
        schema = pq.read_schema(cache)
        meta = json.loads((schema.metadata or {})[META_KEY])
        built = {k: v for k, v in meta["key"].items() if k != STAMP}
        if stamp is not None:
            if meta["key"].get(STAMP) != stamp or built.get("code") != code_key():
                return None
        elif built != {k: v for k, v in key.items() if k != STAMP}:
            return None
        have = [c for c in schema.names if c != "__index_level_0__"]
        wanted = [c for c in have if not c.startswith("_")] if columns is None else [c for c in columns if c in have]
        df = pq.read_table(cache, columns=wanted).to_pandas()
    except (OSError, KeyError, ValueError):
        return None
    for col in (c for c in meta["json_columns"] if c in df.columns):
        df[col] = pd_object([_json(v) if isinstance(v, str) else None for v in df[col].tolist()])
    for line in meta["quarantined"]:
        quarantine.add(line)
    return df


def _json(text: str):
    """A cached JSON cell's value: orjson's parse (the same values as ``json.loads``), ``json``'s
    where orjson refuses the text (NaN, which ``json.dumps`` writes)."""
    import orjson

    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)


def pd_object(values: list):
    """``values`` as one object column (lists and dicts kept whole, missing as None)."""
    import numpy as np

    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def _write(cache: Path, df: "pd.DataFrame", key: dict, quarantined: list[str]) -> None:
    """Write the cache atomically; any failure (read-only store, a column Arrow cannot type)
    leaves no cache: the next read builds the rows again."""
    out = df.copy()
    json_cols = [c for c in out.columns if out[c].dtype == object and any(isinstance(v, (list, dict)) for v in out[c])]
    for c in json_cols:
        out[c] = [None if v is None or (isinstance(v, float) and v != v) else json.dumps(v) for v in out[c]]
    write_parquet(cache, out, META_KEY, json.dumps({"key": key, "json_columns": json_cols, "quarantined": quarantined}))


def write_parquet(cache: Path, df: "pd.DataFrame", meta_key: bytes, meta: str) -> None:
    """``df`` as Parquet at ``cache`` with ``meta`` under ``meta_key`` in its schema metadata,
    written atomically (a temporary file, then a rename); any failure (read-only store, a column
    Arrow cannot type) leaves no file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    tmp = cache.with_name(f".{cache.name}.{os.getpid()}.tmp")
    try:
        table = pa.Table.from_pandas(df, preserve_index=False)
        pq.write_table(table.replace_schema_metadata({**(table.schema.metadata or {}), meta_key: meta}), tmp)
        os.replace(tmp, cache)
    except (OSError, pa.ArrowException, ValueError, TypeError):
        try:
            tmp.unlink()
        except OSError:
            pass


def cached_cells(path: Path, column: str, rows: list[int], expect_rows: int) -> Optional[list]:
    """The values of ``column`` at the row positions ``rows`` of ``path``'s Parquet cache, read in
    batches of ``CELL_BATCH`` rows (only the wanted rows become Python objects, and no more than a
    batch of the column is in memory at once), or None where the cache is missing, lacks the
    column or no longer holds ``expect_rows`` rows (the frame the positions index was read
    from). Call it right after ``files_frame`` read ``path``: that refreshed the cache."""
    import pyarrow.parquet as pq

    try:
        f = pq.ParquetFile(cache_path(path))
        if f.metadata.num_rows != expect_rows or column not in f.schema_arrow.names:
            return None
        order = sorted(range(len(rows)), key=rows.__getitem__)
        out: list = [None] * len(rows)
        start, i = 0, 0
        for batch in f.iter_batches(batch_size=CELL_BATCH, columns=[column]):
            end = start + batch.num_rows
            j = i
            while j < len(order) and rows[order[j]] < end:
                j += 1
            if j > i:
                values = batch.column(0).take([rows[k] - start for k in order[i:j]]).to_pylist()
                for k, v in zip(order[i:j], values):
                    out[k] = v
            i, start = j, end
        return out
    except (OSError, KeyError, ValueError):
        return None


CELL_BATCH = 2048
"""Rows of a cached column ``cached_cells`` holds in memory at once."""
