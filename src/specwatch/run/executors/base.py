"""The executor seam: the runner plans engine groups, an executor runs them.

The runner stays the only writer of the results store: an executor calls each ``GroupJob``'s
``emit`` (the runner's durable append) with the records its groups produce, and never writes a file
of the store itself. What it adds is where a group ran: ``placed`` stamps every record of a group
with its ``Placement`` and counts it into the run's ``RunPlacement``.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import threading
from typing import Callable, Iterable, Optional, Protocol

from specwatch import __version__
from specwatch.core.case import Case
from specwatch.core.placement import ExecutorKind, Placement, RunPlacement, TimingScope
from specwatch.core.record import CaseRecord
from specwatch.run.group import GroupJob
from specwatch.run.options import RunOptions


class Hooks(Protocol):
    """What an executor tells the run's tally (``run.runner._Tally``)."""

    def launch(self, groups: int) -> None:
        """``groups`` more engine groups were launched."""

    def event(self, ev: str) -> None:
        """A worker's or the runner's event line (``core.protocol.Event``)."""


class Executor(Protocol):
    """Runs engine groups; ``run.runner.run_suites`` plans them and hands them over."""

    kind: ExecutorKind
    """Which executor this is (``--executor``)."""
    placed_runs: RunPlacement
    """Where the run's groups went so far (the run summary's ``executor``)."""

    def widest_group(self, host_gpus: int) -> int:
        """The most GPUs one group can be given (``host_gpus``: what the host reports); a case wider
        is recorded skipped, as a case wider than the host always was."""

    def check(self, cases: Iterable[Case]) -> None:
        """Refuse (``SpecwatchInputError``) before anything runs a case it could never place."""

    def run(self, jobs: list[GroupJob], options: RunOptions, expired: Callable[[], bool], hooks: Hooks) -> None:
        """Run ``jobs`` until done or ``expired()``; records go through each job's ``emit``."""


def visible_gpu_ids() -> Optional[list[str]]:
    """This process's ``CUDA_VISIBLE_DEVICES`` as a list (None: unset, every GPU visible)."""
    raw = os.environ.get("CUDA_VISIBLE_DEVICES")
    return None if raw is None else [g.strip() for g in raw.split(",") if g.strip()]


class Placing:
    """The part every executor shares: its ``RunPlacement`` and the stamping of records."""

    kind: ExecutorKind = ExecutorKind.local
    executor_version: Optional[str] = __version__

    def __init__(self, timing_scope: TimingScope = TimingScope.host):
        self.timing_scope = timing_scope
        self.placed_runs = RunPlacement(
            executor=self.kind, executor_version=self.executor_version, timing_scope=timing_scope
        )
        self._lock = threading.Lock()

    def placement(
        self,
        gpu_ids: Optional[list[str]],
        host: Optional[str] = None,
        node_id: Optional[str] = None,
        dispatch_s: Optional[float] = None,
        niceness: Optional[int] = None,
    ) -> Placement:
        return Placement(
            executor=self.kind,
            executor_version=self.executor_version,
            host=host or socket.gethostname(),
            gpu_ids=gpu_ids,
            timing_scope=self.timing_scope,
            node_id=node_id,
            dispatch_s=dispatch_s,
            niceness=niceness,
        )

    def placed(self, job: GroupJob, placement: Placement) -> GroupJob:
        """``job`` whose records carry ``placement`` (``Provenance.placement``), counted in the run's."""
        with self._lock:
            self.placed_runs.add(placement)
        emit = job.emit

        def stamped(rec: CaseRecord) -> None:
            rec.provenance.placement = placement
            emit(rec)

        return dataclasses.replace(job, emit=stamped)

    def widest_group(self, host_gpus: int) -> int:
        return host_gpus

    def check(self, cases: Iterable[Case]) -> None:
        return None
