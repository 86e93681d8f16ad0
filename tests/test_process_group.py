"""live_members: a process group's members that are not zombies, and a teardown that does not
wait on zombies."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specwatch.core.process_group import live_members, stat_fields
from specwatch.run.group import TEARDOWN_WAIT_S, teardown


def _stat(proc: Path, pid: int, comm: str, state: str, pgrp: int) -> None:
    (proc / str(pid)).mkdir()
    (proc / str(pid) / "stat").write_text(f"{pid} ({comm}) {state} 1 {pgrp} {pgrp} 0 -1 4194560 0 0\n")


def test_zombies_and_other_groups_are_not_live(tmp_path):
    _stat(tmp_path, 10, "sglang::sched (tp 0)", "S", 10)
    _stat(tmp_path, 11, "python3", "Z", 10)
    _stat(tmp_path, 12, "python3", "R", 99)
    _stat(tmp_path, 13, "x) R 1 10 (", "X", 10)
    (tmp_path / "self").mkdir()
    assert live_members(10, tmp_path) == [10]
    assert live_members(99, tmp_path) == [12]
    (tmp_path / "10" / "stat").write_text("10 (sglang::sched (tp 0)) Z 1 10 10 0 -1\n")
    assert live_members(10, tmp_path) == []


def _members(pgid: int) -> list[int]:
    """Every pid of the group, zombies included."""
    out = []
    for p in Path("/proc").iterdir():
        try:
            if p.name.isdigit() and int(stat_fields((p / "stat").read_text())[2]) == pgid:
                out.append(int(p.name))
        except OSError:
            pass
    return out


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
def test_teardown_returns_when_only_zombies_are_left(tmp_path):
    # a leader that forks a child and never reaps it: the child is a zombie of the group
    code = "import os, time\nif os.fork() == 0:\n    os._exit(0)\ntime.sleep(60)\n"
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and len(_members(proc.pid)) < 2:
            time.sleep(0.05)  # until the child has exited (a zombie of the group)
        assert len(_members(proc.pid)) == 2
        assert live_members(proc.pid) == [proc.pid]
        os.killpg(proc.pid, signal.SIGSTOP)  # stopped, not dead: still live
        assert live_members(proc.pid) == [proc.pid]
        t0 = time.monotonic()
        teardown(proc.pid, str(tmp_path / "timing.lock"))
        assert time.monotonic() - t0 < TEARDOWN_WAIT_S / 3
        assert live_members(proc.pid) == []
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
