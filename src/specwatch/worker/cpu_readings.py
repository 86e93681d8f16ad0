"""CPU readings over each timed repeat: SGLang's scheduler's own CPU seconds and the host's steal time.

At a small batch SGLang's decode loop is bound by its scheduler's Python, so a window that took
longer either spent more CPU seconds in the scheduler (more work, or a slower core) or waited:
for the GPU, for its other processes, or because the hypervisor ran something else on the core
(steal time, which a virtual machine's kernel counts in ``/proc/stat``). Each repeat's readings
say which: its span (wall seconds from its first timed batch's start to its last's end, the
untimed batches between included), the scheduler's CPU seconds (user + system, every thread,
``/proc/PID/stat``), the steal seconds on the scheduler's cores and on the whole host. Readings
that a host does not give (no ``/proc``, no scheduler found) are None.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from specwatch.core.process_group import stat_fields
from specwatch.worker.pinning import children

PROC = Path("/proc")
"""Where the kernel's process and CPU accounting is read (a test points it elsewhere)."""


def _ticks() -> float:
    try:
        return float(os.sysconf("SC_CLK_TCK"))
    except (ValueError, OSError, AttributeError):
        return 100.0


def process_cpu_s(pid: int, proc: Path = PROC) -> Optional[float]:
    """User + system CPU seconds of ``pid`` (all its threads); None where unreadable."""
    try:
        fields = stat_fields((proc / str(pid) / "stat").read_text())
        return (int(fields[11]) + int(fields[12])) / _ticks()  # utime, stime: fields 14 and 15
    except (OSError, ValueError, IndexError):
        return None


def steal_s(cpu: Optional[int] = None, proc: Path = PROC) -> Optional[float]:
    """Steal seconds of logical CPU ``cpu`` (None: the whole host) since boot; None where unreadable."""
    name = "cpu" if cpu is None else f"cpu{cpu}"
    try:
        for line in (proc / "stat").read_text().splitlines():
            parts = line.split()
            if parts and parts[0] == name:
                return int(parts[8]) / _ticks()  # user nice system idle iowait irq softirq steal
    except (OSError, ValueError, IndexError):
        return None
    return None


def scheduler_of(pinning: Optional[dict]) -> tuple[Optional[int], Optional[list[int]]]:
    """(pid, pinned cpus) of SGLang's first scheduler: from the worker's core pinning where it ran,
    else found among the worker's children (cpus None)."""
    for p in (pinning or {}).get("processes", []):
        if p.get("role") == "scheduler":
            return p.get("pid"), p.get("cpus")
    try:
        found = [p for p in children(os.getpid()) if p.role == "scheduler"]
    except Exception:  # noqa: BLE001 - a reading, never a reason for the case to fail
        return None, None
    return (found[0].pid, None) if found else (None, None)


def _delta(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return None if a is None or b is None else round(b - a, 4)


@dataclass
class CpuReader:
    """``begin`` / ``end`` around each timed repeat (``worker.windows.RepeatLoop.run``)."""

    pid: Optional[int]
    """SGLang's scheduler (None: not found; only steal is read)."""
    cpus: Optional[list[int]] = None
    """The cores it is pinned to (None: not pinned; no per-core steal)."""
    proc: Path = PROC
    repeats: list[dict] = field(default_factory=list)
    _start: Optional[tuple] = None

    def _read(self) -> tuple:
        sched = process_cpu_s(self.pid, self.proc) if self.pid else None
        core = None
        if self.cpus:
            each = [steal_s(c, self.proc) for c in self.cpus]
            core = None if None in each else sum(each)
        return time.perf_counter(), sched, core, steal_s(None, self.proc)

    def begin(self) -> None:
        self._start = self._read()

    def end(self) -> None:
        if self._start is None:
            return
        (t0, s0, c0, h0), (t1, s1, c1, h1) = self._start, self._read()
        self.repeats.append(
            {
                "span_s": round(t1 - t0, 4),
                "scheduler_cpu_s": _delta(s0, s1),
                "core_steal_s": _delta(c0, c1),
                "host_steal_s": _delta(h0, h1),
            }
        )
        self._start = None

    def details(self) -> dict:
        """``details.timed_cpu`` of the record."""
        return {"scheduler_pid": self.pid, "scheduler_cpus": self.cpus, "repeats": list(self.repeats)}
