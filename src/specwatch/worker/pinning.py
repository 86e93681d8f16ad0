"""Core pinning (the suite's ``pin_cores``): SGLang's processes and the worker each on cores of their own.

``sglang.Engine`` runs its tokenizer manager in the calling process (the worker) and starts one
scheduler per TP rank (``sglang::scheduler...``) and a detokenizer (``sglang::detokenizer``) as
children, named with ``setproctitle``. At batch 1 on a small model the decode loop is bound by
those processes' Python, so where the OS moves them between cores, or puts two on one core, a
timed batch slows for reasons of its own. After the engine starts the worker pins each scheduler,
the detokenizer and itself to disjoint sets of cores among those it may use
(``os.sched_getaffinity``): one logical CPU per physical core where the host says which CPUs are
SMT siblings, the lowest allowed core left out when cores are to spare (it takes most interrupts),
and up to ``CORES_PER_PROCESS`` cores per process where the host has them. Every thread of a
process is pinned to its process's set (Linux sets affinity per thread; threads started later
inherit it): a process's threads share its cores, and one core for all of them would make a
thread that spins in a CUDA synchronize (CUDA's default where cores outnumber GPUs) or SGLang's
overlap thread take time from the scheduler's loop. A host with fewer usable cores than processes
is not pinned, and the record says why.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Optional

from specwatch.core.process_group import stat_fields

CORES_PER_PROCESS = 2
"""The most cores one pinned process gets (its main thread and one for its busiest helper)."""

ROLES = ("scheduler", "detokenizer")
"""SGLang child processes pinned, by the role in their title (``sglang::<role>...``)."""


@dataclass(frozen=True)
class Proc:
    """One process of the worker's tree."""

    pid: int
    title: str
    """Its command line as ``ps`` shows it (SGLang's processes: their ``setproctitle`` title)."""

    @property
    def role(self) -> Optional[str]:
        """``scheduler`` / ``detokenizer`` for SGLang's processes, else None."""
        head = self.title.split()[0] if self.title else ""
        return next((r for r in ROLES if head.startswith(f"sglang::{r}")), None)


def children(root: int) -> list[Proc]:
    """Every descendant of ``root``, via psutil where installed, else ``/proc``."""
    try:
        import psutil
    except ImportError:
        return _proc_children(root)
    out = []
    for p in psutil.Process(root).children(recursive=True):
        try:
            out.append(Proc(p.pid, " ".join(p.cmdline())))
        except psutil.Error:
            continue
    return out


def _proc_children(root: int) -> list[Proc]:
    parent: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                parent[int(d.name)] = int(stat_fields((d / "stat").read_text())[1])
            except (OSError, ValueError, IndexError):
                continue
    tree, frontier = [], [root]
    while frontier:
        kids = [pid for pid, pp in parent.items() if pp in frontier]
        tree += kids
        frontier = kids
    return [Proc(pid, _cmdline(pid)) for pid in tree]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def threads(pid: int) -> list[int]:
    """The thread ids of ``pid`` (``/proc/PID/task``); just ``pid`` where that cannot be read."""
    try:
        return sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return [pid]


def one_per_core(allowed: Iterable[int], siblings: Callable[[int], Optional[str]]) -> list[int]:
    """``allowed`` CPUs, one per physical core (the first of each sibling set), in order."""
    seen, out = set(), []
    for cpu in sorted(allowed):
        key = siblings(cpu) or str(cpu)
        if key not in seen:
            seen.add(key)
            out.append(cpu)
    return out


def _sysfs_siblings(cpu: int) -> Optional[str]:
    try:
        return Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list").read_text().strip()
    except OSError:
        return None


def pin_plan(procs: list[Proc], cpus: list[int]) -> tuple[Optional[dict[int, list[int]]], str]:
    """Which CPUs each SGLang process and the worker (key 0) get, from ``cpus`` (one per core):
    disjoint sets of ``CORES_PER_PROCESS`` or as many as the cores allow; (None, why) where there
    are fewer cores than processes."""
    sglang = sorted((p for p in procs if p.role), key=lambda p: (ROLES.index(p.role), p.title, p.pid))
    if not any(p.role == "scheduler" for p in sglang):
        return None, "no sglang::scheduler process among the worker's children"
    need = len(sglang) + 1
    if len(cpus) < need:
        return None, f"{len(cpus)} usable cores for {need} processes ({len(sglang)} SGLang processes and the worker)"
    spare = cpus[1:] if len(cpus) > need else cpus  # the lowest core takes most interrupts
    per = max(1, min(CORES_PER_PROCESS, len(spare) // need))
    plan = {p.pid: spare[i * per : (i + 1) * per] for i, p in enumerate(sglang)}
    plan[0] = spare[len(sglang) * per : need * per]
    return plan, ""


def pin_cores(
    procs: Optional[list[Proc]] = None,
    allowed: Optional[set[int]] = None,
    setaffinity: Callable[[int, set], None] = os.sched_setaffinity,
    tasks: Callable[[int], list[int]] = threads,
    siblings: Callable[[int], Optional[str]] = _sysfs_siblings,
) -> dict:
    """Pin the worker's SGLang processes and the worker itself (``pin_plan``); returns
    ``details.core_pinning``: what was pinned where, or why nothing was."""
    worker = os.getpid()
    allowed = set(os.sched_getaffinity(0)) if allowed is None else allowed
    procs = children(worker) if procs is None else procs
    cpus = one_per_core(allowed, siblings)
    plan, why = pin_plan(procs, cpus)
    if plan is None:
        return {"pinned": False, "reason": why, "allowed_cpus": sorted(allowed)}
    roles = {p.pid: p.role for p in procs}
    pinned = []
    try:
        for pid, cpus_of in plan.items():
            for tid in tasks(pid or worker):
                try:
                    setaffinity(tid, set(cpus_of))
                except ProcessLookupError:  # a thread that ended since it was listed
                    continue
            pinned.append({"pid": pid or worker, "role": roles.get(pid, "worker"), "cpus": cpus_of})
    except OSError as e:
        return {"pinned": False, "reason": f"sched_setaffinity: {e}", "allowed_cpus": sorted(allowed), "done": pinned}
    return {"pinned": True, "processes": pinned, "allowed_cpus": sorted(allowed)}
