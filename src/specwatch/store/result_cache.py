"""A cache of one result computed from results files (the detection floor, the change-point table),
as JSON under the results root (``ROOT/.cache/NAME.json``).

The result is used only while every file it was computed from has the file-system stamp it had
then (``frame_cache.stamp_of``: size, modification and change times, inode, device; any write
moves the change time), the parameters are the same and so is the code: every specwatch source
file and the versions of the libraries the statistics come from (``code_key``). Otherwise it is
computed again and the cache rewritten. A store that cannot be written is read without it.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Callable, Optional, TypeVar

from specwatch.store.frame_cache import stamp_of

T = TypeVar("T")

CACHE_DIR = ".cache"
"""The folder under the results root that holds the cached results."""

LIBRARIES = ("numpy", "pandas", "scipy", "asv")
"""Distributions whose version is part of ``code_key`` (the statistics and the step detector)."""

_PKG = Path(__file__).resolve().parents[1]
_code: list[str] = []


def code_key() -> str:
    """sha256 over every specwatch source file and ``LIBRARIES``' versions (computed once per process)."""
    if not _code:
        from importlib.metadata import PackageNotFoundError, version

        h = hashlib.sha256()
        for f in sorted(_PKG.rglob("*.py")):
            h.update(f.relative_to(_PKG).as_posix().encode() + b"\0" + f.read_bytes())
        for lib in LIBRARIES:
            try:
                h.update(f"{lib}={version(lib)}".encode())
            except PackageNotFoundError:
                h.update(f"{lib}=none".encode())
        _code.append(h.hexdigest())
    return _code[0]


def cache_path(root: Path, name: str) -> Path:
    return Path(root) / CACHE_DIR / f"{name}.json"


def _key(root: Path, params: dict, paths: list[Path]) -> Optional[dict]:
    """What a cached result must have been computed from; None where a file cannot be read."""
    files = []
    for p in sorted({Path(p) for p in paths}):
        try:
            files.append([str(p), *stamp_of(os.stat(p))])
        except OSError:
            return None
    return {"params": params, "files": files, "code": code_key()}


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


def _write(path: Path, data: dict) -> None:
    """Write atomically; any failure (a read-only store) leaves no cache."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(exist_ok=True)
        tmp.write_text(json.dumps(data))
        os.replace(tmp, path)
    except (OSError, TypeError, ValueError):
        try:
            tmp.unlink()
        except OSError:
            pass
