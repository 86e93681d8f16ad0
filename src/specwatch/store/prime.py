"""A store's frame caches built apart from the command that reads them: the missing or stale
caches (``frame_cache``) are built in a forked child (``core.forked``), whose memory is returned
when it ends, while the command reads the fresh ones; it then reads the rebuilt ones warm."""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Callable

from specwatch.core.forked import FORK, Forked
from specwatch.store.frame import files_frame
from specwatch.store.frame_cache import STAMP, cache_meta, cache_path, code_key, fresh_rows, stamp_of
from specwatch.store.jsonl import Quarantine


def build_stale(paths: list[Path]) -> None:
    """Build the missing or stale caches of ``paths`` in a forked child (``core.forked``): the
    memory the build takes (records parsed into rows) is returned with the child, so the caller's
    read of the caches afterwards peaks no higher than a warm read. Call it inside ``one_pass``:
    the child reuses the digests the check took. Quarantined lines are warned about by the
    caller's read (each cache keeps them); where a cache cannot be written the caller's read
    builds the rows itself."""
    start_stale(paths)()


def start_stale(paths: list[Path]) -> Callable[[], None]:
    """``build_stale`` begun: the child builds while the caller goes on (reading the caches that
    are fresh: ``files_frame``'s ``pending``); returns the call that waits for it to end."""
    if not FORK:
        return lambda: None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        stale = [p for p in paths if not stamp_fresh(p) and fresh_rows(p, Quarantine(), [])[0] is None]
    if not stale:
        return lambda: None

    def build() -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            files_frame(stale, columns=[])

    return Forked(build).join


def stamp_fresh(path: Path) -> bool:
    """Whether ``path``'s cache was built from a file of the stamp ``path`` has now (``stamp_of``)
    by today's row code: ``frame_cache.fresh_rows``' first test, from the cache's schema alone
    (False: the sha256 may still find the cache fresh)."""
    meta = cache_meta(cache_path(path))
    try:
        return (
            meta is not None
            and meta["key"].get(STAMP) == stamp_of(os.stat(path))
            and meta["key"].get("code") == code_key()
        )
    except OSError:
        return False
