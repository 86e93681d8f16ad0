"""Whether a process group still has a live member, read from ``/proc``.

``os.killpg(pgid, 0)`` succeeds while any member exists, zombies included. A killed SGLang
scheduler whose parent (the worker) is gone becomes an orphaned zombie, and where the host's init
does not reap orphans (a container's or a sandbox's PID 1) it stays one: a wait on ``killpg`` then
runs to its deadline although every process of the group has exited and released its GPU memory.
A zombie holds no memory and no CUDA context, so it does not count as live here."""

from __future__ import annotations

import os
from pathlib import Path

PROC = Path("/proc")
"""Where the kernel lists processes (Linux)."""


def stat_fields(text: str) -> list[str]:
    """The fields of a ``/proc/PID/stat`` line after the command name (which may hold spaces and
    parentheses): state, ppid, pgrp, ... (``IndexError`` for a line without one)."""
    return text.rsplit(")", 1)[1].split()


def live_members(pgid: int, proc: Path = PROC) -> list[int]:
    """The pids of process group ``pgid`` that are not zombies (state ``Z``) or dead (``X``).
    Without a readable ``proc``, falls back to ``os.killpg(pgid, 0)``: ``[pgid]`` while it succeeds."""
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return []
        return [pgid]
    live = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = stat_fields((entry / "stat").read_text())
        except (OSError, ValueError, IndexError):
            continue  # gone between the listing and the read
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            live.append(int(entry.name))
    return live
