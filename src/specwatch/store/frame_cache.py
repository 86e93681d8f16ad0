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
from dataclasses import dataclass
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
    _PKG / "store" / "step_state.py",
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


_digests: Optional[dict[tuple, object]] = None
"""Within ``one_pass``: (path, size, mtime, ctime, inode) -> the file's sha256, hashed once, and
(that, ``cut``) -> its ``Prefix`` of ``cut`` bytes, found in the same pass."""

_last_prefix: dict[tuple, "Prefix"] = {}
"""Outside ``one_pass``: the ``Prefix`` the last hash found (keyed as in ``_digests``)."""


@dataclass(frozen=True)
class Prefix:
    """The first bytes of a file, as a cache built from an earlier, shorter state of it knows them."""

    sha256: str
    """sha256 of the prefix."""
    lines: int
    """Newlines in the prefix: the number of the first line after it, less one."""
    ends_line: bool
    """Whether the prefix ends with a newline (an appended line then starts a line of its own)."""


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


def _seen(path: Path, st: os.stat_result) -> tuple:
    return (str(Path(path).resolve()), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


def _sha256(path: Path, st: os.stat_result, cut: Optional[int] = None) -> str:
    """The file's sha256; with ``cut`` (a byte count under its size) its ``Prefix`` of that many
    bytes is found in the same pass and kept for ``prefix_of``."""
    seen = _seen(path, st)
    memo = _digests if _digests is not None else {}
    if seen in memo and (cut is None or (seen, cut) in memo):
        return memo[seen]
    digest, prefix = _hash_pass(path, cut)
    if prefix is not None:
        memo[(seen, cut)] = prefix
        if _digests is None:
            _last_prefix.clear()
            _last_prefix[(seen, cut)] = prefix
    memo[seen] = digest
    return digest


def _hash_pass(path: Path, cut: Optional[int], stop_at_cut: bool = False) -> tuple[str, Optional[Prefix]]:
    """(sha256 of the file, its ``Prefix`` of ``cut`` bytes or None where it is shorter or no
    ``cut`` is given), read once; ``stop_at_cut``: the file is read no further than ``cut``."""
    h = hashlib.sha256()
    done, lines, last, prefix = 0, 0, b"", None
    with open(path, "rb") as f:
        while not (stop_at_cut and prefix is not None):
            chunk = f.read(1 << 20 if cut is None or done >= cut else min(1 << 20, cut - done))
            if not chunk:
                break
            h.update(chunk)
            done += len(chunk)
            if cut is not None and done <= cut:
                lines, last = lines + chunk.count(b"\n"), chunk[-1:]
                if done == cut:
                    prefix = Prefix(h.copy().hexdigest(), lines, last == b"\n")
    return h.hexdigest(), prefix


def prefix_of(path: Path, cut: int) -> Optional[Prefix]:
    """The ``Prefix`` of ``cut`` bytes of ``path`` as it is now: the one its last hash found
    (``source_key`` with that cut), else read for it (None: shorter, or unreadable)."""
    try:
        seen = (_seen(path, os.stat(path)), cut)
        found = (_digests if _digests is not None else _last_prefix).get(seen)
        return found if found is not None else _hash_pass(path, cut, stop_at_cut=True)[1]
    except OSError:
        return None


def source_key(path: Path, cut: Optional[int] = None) -> dict:
    """What a cache of ``path`` must have been built from: size, mtime, sha256, row code, and
    (``stamp``, not compared) the file's ``stamp_of`` as hashed. ``cut``: the size of the file an
    older cache was built from, whose ``Prefix`` the same pass finds (``prefix_of``)."""
    st = os.stat(path)
    key = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": _sha256(path, st, cut), "code": code_key()}
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
    JSONL (the file is the one it was built from); otherwise the sha256 decides (the pass that
    finds it also finds the ``Prefix`` a cache of a shorter file was built from: ``frame_append``)."""
    try:
        st = os.stat(path)
    except OSError:
        return None, None  # unreadable: the build reports it
    cache = cache_path(path)
    meta = cache_meta(cache)
    if meta is not None and (hit := _read(cache, meta, None, quarantine, columns, stamp_of(st))) is not None:
        return hit, None
    built = (meta or {}).get("key", {}).get("size")
    try:
        key = source_key(path, built if isinstance(built, int) and 0 < built < st.st_size else None)
    except OSError:
        return None, None
    return None if meta is None else _read(cache, meta, key, quarantine, columns), key


def store_rows(path: Path, df: "pd.DataFrame", key: Optional[dict], quarantined: list[str]) -> None:
    """Cache ``df`` as the rows of ``path`` built under ``key`` (None: not cached)."""
    if key is not None:
        _write(cache_path(path), df, key, quarantined)


def cache_meta(cache: Path) -> Optional[dict]:
    """What a cache says of itself (its ``key``, ``json_columns`` and ``quarantined`` lines) and
    ``columns``, the names of the columns it holds, from its schema alone; None where there is no
    readable cache."""
    import pyarrow.parquet as pq

    try:
        schema = pq.read_schema(cache)
        meta = json.loads((schema.metadata or {})[META_KEY])
        if not isinstance(meta, dict) or not isinstance(meta.get("key"), dict):
            return None
    except (OSError, KeyError, ValueError, TypeError):
        return None
    return {**meta, "columns": [c for c in schema.names if c != "__index_level_0__"]}


def _read(
    cache: Path,
    meta: dict,
    key: Optional[dict],
    quarantine: Quarantine,
    columns: Optional[list[str]] = None,
    stamp: Optional[list[int]] = None,
):
    """The cached rows (``meta``: the cache's ``cache_meta``) when built under ``key`` (its
    ``STAMP`` aside) or, with ``stamp`` instead, from a file of that stamp by today's row code;
    else None."""
    built = {k: v for k, v in meta["key"].items() if k != STAMP}
    if stamp is not None:
        if meta["key"].get(STAMP) != stamp or built.get("code") != code_key():
            return None
    elif built != {k: v for k, v in key.items() if k != STAMP}:
        return None
    return cached_frame(cache, meta, quarantine, columns)


def cached_frame(
    cache: Path, meta: dict, quarantine: Quarantine, columns: Optional[list[str]] = None, hidden: bool = False
):
    """The rows a cache holds, whatever it was built from (``meta``: its ``cache_meta``), its
    quarantined lines added to ``quarantine``; ``columns``: as ``fresh_rows`` reads them;
    ``hidden``: every column, the hidden ones too. None where it cannot be read."""
    import pyarrow.parquet as pq

    names = meta["columns"]
    if not hidden:
        names = [c for c in names if not c.startswith("_")] if columns is None else [c for c in columns if c in names]
    try:
        df = pq.ParquetFile(cache).read(columns=names).to_pandas()  # no dataset layer: faster per file
        json_columns, quarantined = meta["json_columns"], meta["quarantined"]
    except (OSError, KeyError, ValueError, TypeError):
        return None
    for col in (c for c in json_columns if c in df.columns):
        df[col] = pd_object([_json(v) if isinstance(v, str) else None for v in df[col].tolist()])
    for line in quarantined:
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
