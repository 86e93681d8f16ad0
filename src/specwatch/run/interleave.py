"""``specwatch run`` with several ``--fault``: each engine group's passes interleaved start by start.

A run given ``--fault none --fault slow-verify-gpu-500us`` times one engine group under each fault.
Run one fault's groups after the other's and a drift of the host between them reads as the
fault's effect (a clean tiny smoke pair run back to back on an H200 shifted as a whole, up to 35.5%;
the host's Python speed moved up to 2x between its cores and from one pass to the next). Here the
passes of one engine group go ``A0 B0 B1 A1 A2 B2 ...``: engine start ``k`` of every fault before
start ``k + 1`` of any (asv's ``--interleave-rounds``), in the ``--fault`` order on even rounds and
the reverse on odd ones (``run.engine_starts.round_order``: a steady drift within the run cancels
over each two rounds), on one host and, with ``--executor gpus``, on one GPU set. Each fault's
records still go to its own results file and merge only its own engine starts
(``run.engine_starts``).

With a null fault as the second pass (``slow-verify-0us``: the slowdown's edit, no time added) the
same interleaving gives A/A pairs measured exactly as the fault pairs are: ``specwatch noise`` on
them prices the floor the fault is judged against.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Optional

from specwatch.core.case import Case
from specwatch.core.details import RoundOrder
from specwatch.core.placement import ExecutorKind
from specwatch.core.record import CaseRecord
from specwatch.run.engine_starts import run_engine_rounds, run_pair
from specwatch.run.group import GroupJob, run_once, stop_workers
from specwatch.run.options import RunOptions
from specwatch.suite import Suite


def fault_label(fault: Optional[str]) -> str:
    """A fault as ``--fault`` names it (``none``: the clean pass)."""
    return fault or "none"


@dataclass
class InterleavedJob:
    """One engine group under several faults (``members``, one ``GroupJob`` each, in ``--fault``
    order), run start by start in turn. Executors handle it as one job: ``cases`` are its first
    member's (every member shares the engine key), and a record passed to ``emit`` reaches the
    member whose fault it carries (``Provenance.fault``)."""

    members: list[GroupJob]
    """The group's job under each fault, in the order the passes alternate."""
    emit: Callable[[CaseRecord], None] = field(default=None)  # type: ignore[assignment]
    """Delivers a record to its fault's member (replaced by executors that stamp records)."""
    order: RoundOrder = RoundOrder.serpentine
    """How its rounds go: ``serpentine``, or ``paired`` (``--paired``, two passes: each round's
    starts at once, taking turns)."""

    def __post_init__(self) -> None:
        if self.emit is None:
            self.emit = self.deliver

    @property
    def suite(self) -> Suite:
        return self.members[0].suite

    @property
    def cases(self) -> list[Case]:
        return self.members[0].cases

    @property
    def probe(self) -> bool:
        return self.members[0].probe

    @property
    def fault(self) -> Optional[str]:
        """The first pass's fault, for code that reads one fault per job; where a record goes is decided
        by the fault it carries (``deliver``)."""
        return self.members[0].fault

    def deliver(self, rec: CaseRecord) -> None:
        """Stamp ``details.interleaved`` and append ``rec`` through its fault's member."""
        faults = [fault_label(m.fault) for m in self.members]
        rounds = self.suite.spec.suite.engine_starts
        rec.details["interleaved"] = {"faults": faults, "rounds": rounds, "order": self.order.value}
        by_fault = {m.fault: m for m in self.members}
        by_fault.get(rec.provenance.fault, self.members[0]).emit(rec)

    def run(self, options: RunOptions, on_event: Optional[Callable[[str], None]] = None) -> None:
        """Every member's engine starts, round by round (``run.engine_starts.run_engine_rounds``);
        with ``--paired`` (two passes) each round's two starts at once, taking turns (``run_pair``)."""
        passes = [replace(m, emit=self.emit) for m in self.members]
        starts = self.suite.spec.suite.engine_starts
        paired = self.order is RoundOrder.paired

        def one(j) -> None:
            run_once(j, options, on_event)

        if starts > 1:
            run_engine_rounds(passes, starts, one, stop=stop_workers, paired=paired)
        elif paired:
            run_pair(passes, 0, one, stop_workers)
        else:
            for job in passes:
                one(job)


def interleaved(per_fault: list[list[GroupJob]], paired: bool = False) -> list:
    """One suite's jobs, given per fault in ``--fault`` order, as one job per engine group: an
    ``InterleavedJob`` where several faults run the group, the ``GroupJob`` itself where one does
    (``--resume`` may have finished a group under some faults only). Groups keep the first fault's
    order; a group only a later fault runs follows. ``paired`` (``--paired``): a group of two passes
    runs them at once, taking turns."""
    by_key: dict[tuple, list[GroupJob]] = {}
    for jobs in per_fault:
        for job in jobs:
            by_key.setdefault(job.cases[0].engine_key(), []).append(job)

    def job(members: list[GroupJob]):
        if len(members) == 1:
            return members[0]
        order = RoundOrder.paired if paired and len(members) == 2 else RoundOrder.serpentine
        return InterleavedJob(members, order=order)

    return [job(members) for members in by_key.values()]


def interleaves(options: RunOptions) -> bool:
    """Whether the run interleaves its faults' passes: several ``--fault``, on this host's executors
    (a Ray cluster places each pass as a task of its own, and a lost node's records of a job are filed
    under one fault)."""
    return len(options.faults) > 1 and options.executor is not ExecutorKind.ray
