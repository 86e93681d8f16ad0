"""Temporary folders of running workers and plain loops, removed also when the runner is stopped."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from typing import Iterator

SCRATCH_DIRS: set[str] = set()
"""Temporary folders of running workers and plain loops (``scratch_dir``): a stopped runner exits
from its signal handler, where no ``with`` block ends, so the handler removes them
(``remove_scratch``)."""


@contextlib.contextmanager
def scratch_dir(prefix: str) -> Iterator[str]:
    """A temporary folder for one worker's spec, log and results, removed when the block ends or
    the runner is stopped (``SCRATCH_DIRS``)."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        SCRATCH_DIRS.add(tmp)
        try:
            yield tmp
        finally:
            SCRATCH_DIRS.discard(tmp)


def remove_scratch() -> None:
    """Remove every folder ``scratch_dir`` holds now (a stopped runner, its workers killed)."""
    for tmp in list(SCRATCH_DIRS):
        shutil.rmtree(tmp, ignore_errors=True)
        SCRATCH_DIRS.discard(tmp)
