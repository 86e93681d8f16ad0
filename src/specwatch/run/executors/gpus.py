"""``--executor gpus``: one host, N GPUs; each engine group on a GPU set of its own, sized by its tp.

A group of tp t is given t free GPUs of one NVLink island (``topology``) through its worker's
``CUDA_VISIBLE_DEVICES`` (with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, so the ids mean what nvidia-smi
means). A GPU belongs to one group at a time: no engine shares a GPU with another group's, so the
ranks of a tp engine start on GPUs equally free and SGLang's "memory capacity is unbalanced"
refusal (``_check_tp_memory_balance``: a rank with under 0.9 of another's free memory) is never
caused by the placement. Groups are queued widest tp first (the wide ones find the host empty),
suite order within a tp; a group waits at the head of the queue until its GPUs are free.

``--timing-scope host`` (the default) keeps today's guarantee host-wide: every worker shares one
timing lock (``core.timing_lock``), so a timed batch overlaps no other group's timed batch nor an
engine start, on any GPU. ``--timing-scope gpu`` drops the lock: timed batches on different GPU sets
run at once and share only the host's CPU.
"""

from __future__ import annotations

import os
import tempfile
import threading
from dataclasses import replace
from pathlib import Path
from typing import Callable, Iterable, Optional

from specwatch.core.case import Case
from specwatch.core.errors import SpecwatchInputError
from specwatch.core.placement import ExecutorKind, TimingScope
from specwatch.run.executors.base import Hooks, Placing
from specwatch.run.executors.topology import Topology, discover
from specwatch.run.group import GroupJob
from specwatch.run.options import RunOptions
from specwatch.run.schedule import _parallel_env


class GpuPool:
    """The host's GPUs, free or leased, by island."""

    def __init__(self, islands: list[list[str]]):
        self.islands = [list(i) for i in islands]
        self.free = {g for i in islands for g in i}
        self.changed = threading.Condition()

    def take(self, tp: int) -> Optional[list[str]]:
        """``tp`` free GPUs of one island (the island with the fewest free that fit, lowest ids
        first), now leased; None when no island has them free. Call with ``changed`` held."""
        fits = [[g for g in i if g in self.free] for i in self.islands]
        fits = [f for f in fits if len(f) >= tp]
        if not fits:
            return None
        ids = min(fits, key=len)[:tp]
        self.free -= set(ids)
        return ids

    def give_back(self, ids: list[str]) -> None:
        with self.changed:
            self.free |= set(ids)
            self.changed.notify_all()


def group_env(extra_env: Optional[dict], ids: list[str], slots: int, lock_path: Path, scope: TimingScope) -> dict:
    """A group's worker environment: its GPUs, and the host-wide timing lock under ``host`` scope
    (``slots``: groups that may be in flight, recorded as ``details.parallel_starts``)."""
    if scope is TimingScope.host:
        env = _parallel_env(extra_env, lock_path, slots, overlap=False)
    else:
        env = dict(extra_env or {})
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // slots)))
    env["CUDA_VISIBLE_DEVICES"] = ",".join(ids)
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    return env


class GpusExecutor(Placing):
    """Groups spread over this host's GPUs (``--gpus`` or all it lists), one GPU set per group."""

    kind = ExecutorKind.gpus

    def __init__(self, options: RunOptions, topology: Optional[Topology] = None):
        super().__init__(options.timing_scope)
        self.topology = topology or discover(options.gpu_ids)

    def widest_group(self, host_gpus: int) -> int:
        return len(self.topology.gpus)

    def check(self, cases: Iterable[Case]) -> None:
        """A tp the GPUs could hold but no island can is a placement error, not a skip."""
        wide = sorted({c.tp for c in cases if self.topology.widest < c.tp <= len(self.topology.gpus)})
        if wide:
            raise SpecwatchInputError(
                None,
                f"tp {wide[-1]} needs {wide[-1]} GPUs of one NVLink island; the GPUs given form the islands "
                f"{self.topology.describe()} (nvidia-smi topo -m): give GPUs of one island",
                field="--gpus",
            )

    def run(self, jobs: list[GroupJob], options: RunOptions, expired: Callable[[], bool], hooks: Hooks) -> None:
        """Lease GPUs to the queued groups as they free up (widest tp first), one thread per group
        in flight, until every group ran or ``expired()``."""
        pool = GpuPool(self.topology.islands)
        queue = sorted(jobs, key=lambda j: -j.cases[0].tp)
        slots = len(self.topology.gpus)
        threads: list[threading.Thread] = []
        with tempfile.TemporaryDirectory(prefix="specwatch-lock-") as tmp:
            lock = Path(tmp) / "timing.lock"

            def one(job: GroupJob, ids: list[str]) -> None:
                try:
                    env = group_env(options.extra_env, ids, slots, lock, self.timing_scope)
                    job.run(replace(options, extra_env=env), hooks.event)
                finally:
                    pool.give_back(ids)

            while queue and not expired():
                ids = self._lease(pool, queue[0].cases[0].tp, expired)
                if ids is None:
                    break
                job = self.placed(queue.pop(0), self.placement(ids))
                hooks.launch(1)
                t = threading.Thread(target=one, args=(job, ids), daemon=True)
                t.start()
                threads.append(t)
            for t in threads:
                t.join()

    @staticmethod
    def _lease(pool: GpuPool, tp: int, expired: Callable[[], bool]) -> Optional[list[str]]:
        """Wait until ``tp`` GPUs of one island are free and lease them; None once ``expired()``."""
        with pool.changed:
            while True:
                ids = pool.take(tp)
                if ids is not None or expired():
                    return ids
                pool.changed.wait(timeout=1.0)
