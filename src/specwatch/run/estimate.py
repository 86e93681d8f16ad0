"""What a run would still do: cases not yet recorded on a machine, their engine groups, and the
device time those cost at the machine's recorded pace (``specwatch plan --known``); and the wall
time of a sweep on N hosts of G GPUs, the recorded engine starts and case times list-scheduled over
the GPUs (``specwatch plan --hosts``, docs/scale-out.md)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from specwatch.core.case import Case
from specwatch.core.errors import SpecwatchInputError
from specwatch.core.placement import TimingScope
from specwatch.core.record import CaseRecord, Status
from specwatch.run.runner import engine_groups
from specwatch.store.jsonl import RUNS_FILE, read_records, read_runs, recorded_case_ids, results_path
from specwatch.suite import PlannedCase


@dataclass
class DeviceEstimate:
    """The part of a suite's plan a run on ``machine`` would still do, and its device time."""

    suite: str
    machine: str
    sglang_version: str
    known: int
    """Planned cases already recorded (any status) for this machine and SGLang version."""
    left: list[PlannedCase]
    """Planned cases not yet recorded, in plan order (skipped ones included)."""
    groups: int
    """Engine groups the runnable, non-duplicate cases of ``left`` start."""
    per_group_s: Optional[float]
    """Median wall seconds per engine group over the machine's recorded runs (None: no such run)."""
    runs: int
    """Recorded runs the pace comes from (runs a signal stopped are left out)."""
    engine_starts: int = 1
    """Times each group runs, each on a fresh engine (``[suite] engine_starts``)."""
    suite_spans_s: Optional[list[float]] = None
    """Wall seconds each ``left`` group takes at the suite's own recorded pace (``suite_group_spans``:
    a recorded group of the same model, else of any model), all its engine starts included; None
    where the suite has no records on the machine."""

    @property
    def device_minutes(self) -> Optional[float]:
        """The sum of ``suite_spans_s`` where the suite has its own pace, else ``groups`` x
        ``engine_starts`` x ``per_group_s``, in minutes (first-use compiles on a fresh host come on
        top)."""
        if not self.groups:
            return None
        if self.suite_spans_s is not None:
            return sum(self.suite_spans_s) / 60
        if self.per_group_s is None:
            return None
        return self.groups * self.engine_starts * self.per_group_s / 60


def suite_group_spans(root: Path, machine: str, suite: str) -> dict[str, list[float]]:
    """Wall seconds per recorded engine group of ``suite`` on ``machine`` (every SGLang version),
    by model: from the first case's start to the last one's end over the group's newest records (a
    merged record of several engine starts spans them all), plus the group's median recorded
    engine start where one is recorded. A suite's own pace prices what its options cost (windows,
    engine starts, baselines), which the machine-wide pace per group does not."""
    spans: dict[str, list[float]] = {}
    for path in sorted((Path(root) / machine).glob(f"*/{suite}.jsonl")):
        newest = {r.case_id: r for r in read_records(path) if r.status is not Status.skipped}
        for cases in engine_groups(r.case for r in newest.values()):
            recs = [newest[c.case_id] for c in cases]
            span = (
                max(r.provenance.finished_at for r in recs) - min(r.provenance.started_at for r in recs)
            ).total_seconds()
            if span <= 0:
                continue  # records without their own clock readings price nothing
            starts = [r.metrics["engine_start_time"].value for r in recs if "engine_start_time" in r.metrics]
            spans.setdefault(cases[0].model, []).append(span + (statistics.median(starts) if starts else 0.0))
    return spans


def estimate(
    suite: str,
    planned: list[PlannedCase],
    root: Path,
    machine: str,
    sglang_version: str,
    engine_starts: int = 1,
    fault: Optional[str] = None,
) -> DeviceEstimate:
    """Leave out the planned cases recorded under ``root`` for the machine and version (in the
    results file of ``fault``'s pass: ``SUITE+fault-NAME.jsonl``; None: the clean one), and price
    the rest's engine groups at the suite's own recorded pace (``suite_group_spans``) where it has
    one, else each run ``engine_starts`` times at the median wall time per group of the machine's
    past runs (all SGLang versions: the pace is the host's)."""
    done = recorded_case_ids(results_path(root, machine, sglang_version, suite, fault))
    left = [p for p in planned if p.case.case_id not in done]
    groups = engine_groups(p.case for p in left if p.skip is None and not p.duplicate)
    runs = [
        r
        for f in sorted((Path(root) / machine).glob(f"*/{RUNS_FILE}"))
        for r in read_runs(f)
        if r.engine_groups and not r.stopped_by
    ]
    per_group = statistics.median(r.wall_s / r.engine_groups for r in runs) if runs else None
    own = suite_group_spans(root, machine, suite)
    every = [s for spans in own.values() for s in spans]
    suite_spans = [statistics.median(own.get(g[0].model) or every) for g in groups] if every else None
    return DeviceEstimate(
        suite,
        machine,
        sglang_version,
        len(planned) - len(left),
        left,
        len(groups),
        per_group,
        len(runs),
        engine_starts,
        suite_spans,
    )


@dataclass(frozen=True)
class GroupTime:
    """One engine group's device time as a run would spend it: its engine start, then its cases."""

    tp: int
    """GPUs the group's engine takes, all on one host."""
    start_s: float
    """Seconds its engine takes to start (recorded ``engine_start_time``)."""
    cases_s: float
    """Seconds its cases take once the engine is up (recorded ``finished_at - started_at`` per case)."""

    @property
    def total_s(self) -> float:
        return self.start_s + self.cases_s


@dataclass
class WallEstimate:
    """A sweep's wall time on ``hosts`` x ``gpus_per_host`` GPUs (``specwatch plan --hosts``)."""

    hosts: int
    gpus_per_host: int
    lanes_per_gpu: int
    """Engine groups one GPU holds at once (``--parallel-starts``; 1: one group per GPU)."""
    groups: int
    """Engine groups placed (a group wider than a host is skipped, as a run skips its cases)."""
    wall_s: float
    """When the last host is done (``host_wall`` of the groups ``list_schedule`` gave each host)."""
    serial_s: float
    """The groups' device time one after another (one GPU, one group at a time)."""
    priced: dict
    """How the starts and cases were priced: ``own`` (a record of that case / group), ``like``
    (the median of recorded ones of the same model and tp), ``any`` (the median of all)."""


def list_schedule(groups: list[GroupTime], hosts: int, gpus_per_host: int, lanes_per_gpu: int = 1) -> list[int]:
    """The host each of ``groups`` goes to, in the executors' order (widest tp first, plan order
    within a tp) on ``hosts`` hosts of ``gpus_per_host`` GPUs, ``lanes_per_gpu`` groups per GPU: each
    group starts when a host has ``tp`` lanes free (the host where that is soonest) and no sooner than
    the group before it (the queue's head waits, as ``--executor gpus`` and ``ray`` do). A group
    holds its lanes for ``total_s``."""
    free = [[0.0] * (gpus_per_host * lanes_per_gpu) for _ in range(hosts)]
    where = [0] * len(groups)
    head = 0.0
    for n in sorted(range(len(groups)), key=lambda i: -groups[i].tp):
        g = groups[n]
        when = [sorted(h)[g.tp - 1] for h in free]
        host = min(range(hosts), key=lambda i: when[i])
        head = max(head, when[host])
        for i in sorted(range(len(free[host])), key=lambda i: free[host][i])[: g.tp]:
            free[host][i] = head + g.total_s
        where[n] = host
    return where


def makespan(groups: list[GroupTime], gpus: int, lanes_per_gpu: int = 1) -> float:
    """When the last of ``groups`` ends on one host of ``gpus`` GPUs (``list_schedule``)."""
    free = [0.0] * (gpus * lanes_per_gpu)
    head = 0.0
    for g in sorted(groups, key=lambda g: -g.tp):
        head = max(head, sorted(free)[g.tp - 1])
        for i in sorted(range(len(free)), key=lambda i: free[i])[: g.tp]:
            free[i] = head + g.total_s
    return max(free, default=0.0)


def host_wall(groups: list[GroupTime], gpus: int, lanes_per_gpu: int, scope: TimingScope) -> float:
    """One host's wall time for its ``groups``. Under ``TimingScope.gpu`` groups on different GPUs
    run wholly at once (the makespan). Under ``host`` a timed case excludes every other timed case
    and every engine start of the host (``core.timing_lock``), so the host's case time is spent one
    case at a time and only the engine starts overlap: the starts' makespan plus every case."""
    if scope is TimingScope.gpu:
        return makespan(groups, gpus, lanes_per_gpu)
    starts = [GroupTime(g.tp, g.start_s, 0.0) for g in groups]
    return makespan(starts, gpus, lanes_per_gpu) + sum(g.cases_s for g in groups)


class Pace:
    """Recorded engine-start and case times of one machine and SGLang version, per case and per
    (model, tp), read from the suite's results file (the newest record of each case counts)."""

    def __init__(self, records: list[CaseRecord]):
        self.case_s: dict[str, float] = {}
        self.start_s: dict[str, float] = {}
        self.models: dict[tuple, list[tuple[Optional[float], float]]] = {}
        for r in records:
            took = (r.provenance.finished_at - r.provenance.started_at).total_seconds()
            start = r.metrics.get("engine_start_time")
            self.case_s[r.case_id] = took
            if start is not None:
                self.start_s[r.case_id] = start.value
            self.models.setdefault((r.case.model, r.case.tp), []).append((None if start is None else start.value, took))
        self.all = [v for vs in self.models.values() for v in vs]

    def _median(self, case: Case, i: int) -> tuple[Optional[float], str]:
        for how, pool in (("like", self.models.get((case.model, case.tp), [])), ("any", self.all)):
            vals = [v[i] for v in pool if v[i] is not None]
            if vals:
                return statistics.median(vals), how
        return None, "none"

    def case(self, case: Case) -> tuple[Optional[float], str]:
        """Seconds ``case`` takes once its engine is up, and how it was priced."""
        if case.case_id in self.case_s:
            return self.case_s[case.case_id], "own"
        return self._median(case, 1)

    def start(self, cases: list[Case]) -> tuple[Optional[float], str]:
        """Seconds the engine of the group of ``cases`` takes to start, and how it was priced."""
        own = [self.start_s[c.case_id] for c in cases if c.case_id in self.start_s]
        if own:
            return statistics.median(own), "own"
        return self._median(cases[0], 0)


def group_times(planned: list[PlannedCase], pace: Pace, priced: Optional[dict] = None) -> list[GroupTime]:
    """The engine groups of the runnable, non-duplicate ``planned`` cases, priced by ``pace``;
    ``priced`` counts how (``own`` / ``like`` / ``any``). None when nothing recorded prices them."""
    out = []
    priced = {} if priced is None else priced
    for cases in engine_groups(p.case for p in planned if p.skip is None and not p.duplicate):
        start, how = pace.start(cases)
        priced[f"start {how}"] = priced.get(f"start {how}", 0) + 1
        took = 0.0
        for c in cases:
            s, how = pace.case(c)
            priced[f"case {how}"] = priced.get(f"case {how}", 0) + 1
            took += s or 0.0
        if start is None:
            raise SpecwatchInputError(None, "no recorded engine start to price the plan with", field="--pace")
        out.append(GroupTime(cases[0].tp, start, took))
    return out


def wall_estimate(
    suite: str,
    planned: list[PlannedCase],
    root: Path,
    machine: str,
    sglang_version: str,
    hosts: int,
    gpus_per_host: int,
    lanes_per_gpu: int = 1,
    scope: TimingScope = TimingScope.host,
) -> WallEstimate:
    """The wall time of ``planned`` on ``hosts`` x ``gpus_per_host`` GPUs at the pace recorded under
    ``root`` for the machine and SGLang version (``list_schedule`` over ``group_times``)."""
    path = results_path(root, machine, sglang_version, suite)
    if not path.exists():
        raise SpecwatchInputError(path, "no records to take engine-start and case times from", field="--pace")
    pace = Pace([r for r in read_records(path) if r.status is Status.ok])
    priced: dict = {}
    groups = [g for g in group_times(planned, pace, priced) if g.tp <= gpus_per_host]
    where = list_schedule(groups, hosts, gpus_per_host, lanes_per_gpu)
    walls = [
        host_wall([g for g, w in zip(groups, where) if w == h], gpus_per_host, lanes_per_gpu, scope)
        for h in range(hosts)
    ]
    return WallEstimate(
        hosts,
        gpus_per_host,
        lanes_per_gpu,
        len(groups),
        max(walls, default=0.0),
        sum(g.total_s for g in groups),
        priced,
    )
