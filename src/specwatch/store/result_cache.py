"""A cache of one result computed from results files (the detection floor, the change-point table),
as JSON under the results root (``ROOT/.cache/NAME.json``), or of any picklable value (the
dashboard's tables and figures: ``cached_value``, ``ROOT/.cache/NAME.pkl``).

The result is used only while every file it was computed from has the file-system stamp it had
then (``frame_cache.stamp_of``: size, modification and change times, inode, device; any write
moves the change time), the parameters are the same and so is the code: every file of the
specwatch package (sources, suites, templates) and the versions of the libraries the results come
from (``code_key``). Otherwise it is computed again and the cache rewritten. A store that cannot
be written is read without it. The pickles are the store's own files, written by this module;
like the store's other caches they are trusted as such.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
from pathlib import Path
from typing import Any, Callable, Optional, TypeVar

from specwatch.store.frame_cache import stamp_of

T = TypeVar("T")

CACHE_DIR = ".cache"
"""The folder under the results root that holds the cached results."""

LIBRARIES = ("numpy", "pandas", "scipy", "asv", "pyarrow", "matplotlib", "jinja2", "markdown-it-py", "pydantic")
"""Distributions whose version is part of ``code_key`` (the statistics, the step detector, the
frames, the figures and the pages drawn from them)."""

_PKG = Path(__file__).resolve().parents[1]
_code: list[str] = []


def code_key() -> str:
    """sha256 over every file of the specwatch package (its sources, suites and templates; no
    bytecode) and ``LIBRARIES``' versions (computed once per process)."""
    if not _code:
        from importlib.metadata import PackageNotFoundError, version

        h = hashlib.sha256()
        for f in sorted(f for f in _PKG.rglob("*") if f.is_file() and "__pycache__" not in f.parts):
            h.update(f.relative_to(_PKG).as_posix().encode() + b"\0" + f.read_bytes())
        for lib in LIBRARIES:
            try:
                h.update(f"{lib}={version(lib)}".encode())
            except PackageNotFoundError:
                h.update(f"{lib}=none".encode())
        _code.append(h.hexdigest())
    return _code[0]


def cache_path(root: Path, name: str, suffix: str = ".json") -> Path:
    return Path(root) / CACHE_DIR / f"{name}{suffix}"


def _key(root: Path, params: dict, paths: list[Path]) -> Optional[dict]:
    """What a cached result must have been computed from; None where a file cannot be read."""
    files = file_stamps(paths)
    return None if files is None else {"params": params, "files": files, "code": code_key()}


def file_stamps(paths: list[Path]) -> Optional[list[list]]:
    """[path, *``stamp_of``] of each of ``paths``, sorted; None where a file cannot be read."""
    files = []
    for p in sorted({Path(p) for p in paths}):
        try:
            files.append([str(p), *stamp_of(os.stat(p))])
        except OSError:
            return None
    return files


def cached_result(
    root: Path,
    name: str,
    params: dict,
    paths: list[Path],
    compute: Callable[[], T],
    dump: Callable[[T], Any],
    load: Callable[[Any], T],
) -> T:
    """``compute()`` of the files ``paths`` under ``params``, or the cached result of the same
    (``load`` of what ``dump`` gave, as JSON) where it is fresh; a fresh computation is cached."""
    key = _key(root, params, paths)
    path = cache_path(root, name)
    if key is not None:
        try:
            stored = json.loads(path.read_text())
            if stored["key"] == key:
                return load(stored["value"])
        except (OSError, ValueError, KeyError, TypeError):
            pass
    value = compute()
    if key is not None and key == _key(root, params, paths):  # no file changed meanwhile
        _write(path, {"key": key, "value": dump(value)})
    return value


def cached_value(root: Path, name: str, key: dict, compute: Callable[[], T]) -> T:
    """``compute()``, or the value kept under ``key`` (JSON: what the value is computed from, its
    files as ``file_stamps`` gave them before they were read: a value computed while one was
    written is kept under stamps no file has again), as that key's JSON line and the value's
    pickle (``ROOT/.cache/NAME.pkl``; only the line is read where the key differs)."""
    path = cache_path(root, name, PICKLE_SUFFIX)
    try:
        with open(path, "rb") as f:
            if json.loads(f.readline()) == key:
                return pickle.load(f)
    except (OSError, ValueError, EOFError, TypeError, IndexError, AttributeError, ImportError, pickle.PickleError):
        pass  # none, another key, or not readable as written: computed again
    value = compute()
    try:
        data = json.dumps(key).encode() + b"\n" + pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except (TypeError, AttributeError, pickle.PickleError):  # a value pickle refuses: not kept
        return value
    _write(path, data)
    return value


PICKLE_SUFFIX = ".pkl"
"""The name ending of a ``cached_value`` file."""


def _write(path: Path, data: dict | bytes) -> None:
    """Write atomically (``data``: JSON, or the bytes themselves); any failure (a read-only store)
    leaves no cache."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(data if isinstance(data, bytes) else json.dumps(data).encode())
        os.replace(tmp, path)
    except (OSError, TypeError, ValueError):
        try:
            tmp.unlink()
        except OSError:
            pass
