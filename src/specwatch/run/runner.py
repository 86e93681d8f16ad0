"""GPU sweep runner: the case loop, one child process per engine group, durable records.

Cases that share every engine-level parameter (``case.ENGINE_FIELDS``) form a group and are run
by one child process (``python -m specwatch.worker``) that starts ``sglang.Engine`` once
and serves all of them. The child reports each case on its own line as it finishes; the parent
turns lines into ``CaseRecord`` s with provenance and appends them durably. When the child dies
(SGLang kills its parent process when a scheduler dies, so the runner must not be its parent) or runs past its
timeout, the case it was on is recorded ``crashed`` / ``timeout`` with the log tail, and a fresh
child takes the group's remaining cases.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from contextlib import ExitStack
from pathlib import Path
from typing import Callable, Iterable, Optional

from specwatch.core.case import Case
from specwatch.core.placement import ExecutorKind, RunPlacement, TimingScope
from specwatch.core.record import CaseRecord, RunSummary, Status, new_run_id, utcnow
from specwatch.core.sglang_host import sglang_version
from specwatch.run.baseline import BaselineJob, check_baseline
from specwatch.run.case_records import failure_record
from specwatch.run.executors import Executor, make_executor
from specwatch.run.group import STARTED_EVENT, GroupJob
from specwatch.run.interleave import interleaved, interleaves
from specwatch.run.options import RunOptions, Shard
from specwatch.run.provenance import host_facts, machine_label, specwatch_commit
from specwatch.run.schedule import _kill_workers_on_sigterm, stop_signals_held
from specwatch.store.jsonl import (
    WriterLock,
    append_record,
    append_run,
    finished_case_ids,
    recorded_case_ids,
    results_path,
)
from specwatch.store.twins import TwinBoard
from specwatch.suite import PlannedCase, Suite, selected

__all__ = ["Executor", "RunOptions", "Shard", "engine_groups", "plan_run", "run_suite", "run_suites"]


def engine_groups(cases: Iterable[Case]) -> list[list[Case]]:
    """Group cases by engine key, keeping first-seen order; within a group, file order."""
    groups: "OrderedDict[tuple, list[Case]]" = OrderedDict()
    for c in cases:
        groups.setdefault(c.engine_key(), []).append(c)
    return list(groups.values())


def plan_run(
    suite: Suite,
    fault: Optional[str],
    results_root: Path,
    facts: dict,
    options: RunOptions,
    emit_progress: Optional[Callable[[CaseRecord], None]] = None,
    record_lock: Optional[threading.Lock] = None,
    run_id: Optional[str] = None,
    writer_locks: Optional[ExitStack] = None,
    widest: Optional[int] = None,
) -> tuple[Path, list[GroupJob]]:
    """Record the suite's skips under ``fault``, return its results file and its engine groups still
    to run (``options``: resume, shard, where, known_root, bare, group_timeout_s).
    ``run_id``: stamped on every record this run appends (``Provenance.run_id``).
    ``writer_locks``: takes the results file's ``WriterLock`` into it (held until it closes).
    ``widest``: GPUs one group can be given (``Executor.widest_group``; default the host's count).
    Long because its records' one writer (``emit``: run id, plain twins' speedup) is a closure here."""
    widest = facts["gpu_count"] if widest is None else widest
    probe = options.probe
    where_in_store = (machine_label(facts), sglang_version(), suite.name, fault, probe)
    out = results_path(results_root, *where_in_store)
    if writer_locks is not None:
        writer_locks.enter_context(WriterLock(out))
    done = finished_case_ids(out) if options.resume else set()
    if options.known_root is not None:
        done |= recorded_case_ids(results_path(options.known_root, *where_in_store))
    lock = record_lock or threading.Lock()
    twins = TwinBoard.of_file(out) if suite.spec.suite.speedup else TwinBoard(off=True)  # [suite] speedup

    def emit(rec: CaseRecord) -> None:
        rec.provenance.run_id = run_id
        rec = twins.add(rec)
        with stop_signals_held(), lock:  # a record and its tally land together, or neither
            append_record(out, rec)
            if emit_progress:
                emit_progress(rec)

    planned: list[PlannedCase] = [p for p in selected(suite.plan(), options.where or {}) if not p.duplicate]
    runnable: list[Case] = []
    for p in planned:
        if p.case.case_id in done:
            continue
        if p.skip:
            emit(failure_record(suite, p.case, Status.skipped, p.skip, None, fault, utcnow(), probe))
        elif p.case.tp > widest:
            reason = f"host: needs {p.case.tp} GPUs, this host has {widest}"
            emit(failure_record(suite, p.case, Status.skipped, reason, None, fault, utcnow(), probe))
        else:
            runnable.append(p.case)
    groups = engine_groups(runnable)
    if options.shard:
        groups = [g for i, g in enumerate(groups) if i % options.shard.count == options.shard.index - 1]
    job = BaselineJob if options.baseline else GroupJob  # --baseline: probed and plain runs alternate
    return out, [
        job(suite, fault, g, emit, options.group_timeout_s, probe, out, options.resume, options.start_progress)
        for g in groups
    ]


def check_bare(faults: Iterable[Optional[str]], bare: bool) -> None:
    """A bare run has no probe, and faults are applied by the probe: refuse the pair."""
    if bare and any(f is not None for f in faults):
        raise ValueError("a bare run has no probe, so it cannot inject faults: drop --fault or --bare")


def check_overlap(overlap_starts: bool, parallel_starts: int, timing_lock: Optional[Path] = None) -> None:
    """Overlapping starts only mean something with several engines in flight: refuse it alone. A
    timing lock shared with other runs is for overlapped runs only: a wave's runner holds the lock
    shared while its engines start, which would stall the other runs' timed batches."""
    if overlap_starts and parallel_starts <= 1:
        raise ValueError("--overlap-starts keeps K engine groups in flight: give --parallel-starts K with K > 1")
    if timing_lock is not None and not overlap_starts:
        raise ValueError("--timing-lock is shared with other runs' workers: give it with --overlap-starts")


def check_executor(options: RunOptions) -> None:
    """Options that belong to one executor are refused with another; ``--parallel-starts`` overlaps
    engines on one GPU set, which only the local executor does."""
    kind = options.executor
    if kind is not ExecutorKind.local and options.parallel_starts > 1:
        raise ValueError(
            f"--parallel-starts overlaps engines on one GPU set: --executor {kind.value} runs one group per set"
        )
    if options.gpu_ids is not None and kind is not ExecutorKind.gpus:
        raise ValueError("--gpus picks this host's GPUs for --executor gpus: give it with --executor gpus")
    if options.ray_address is not None and kind is not ExecutorKind.ray:
        raise ValueError("--address is a Ray cluster's: give it with --executor ray")
    if options.timing_scope is TimingScope.gpu and kind is ExecutorKind.local:
        raise ValueError("--timing-scope gpu needs GPU sets of their own: give it with --executor gpus or ray")


def wanted_cases(suites: list[Suite], options: RunOptions) -> list[Case]:
    """The cases the run means to start (not skipped, not a duplicate, selected by ``where``)."""
    return [p.case for s in suites for p in selected(s.plan(), options.where or {}) if not p.duplicate and not p.skip]


def run_suites(suites: list[Suite], results_root: Path, options: RunOptions = RunOptions()) -> list[Path]:
    """Run every planned case of each suite once per fault of ``options.faults`` (``None``: clean),
    several faults' passes over an engine group interleaved start by start (``run.interleave``);
    returns the results files. ``RunOptions`` says how: ``parallel_starts`` > 1 starts that many
    engines at once and times them one at a time (``specwatch.core.timing_lock``), ``stop_after_s``
    starts no new group (or wave) after that many seconds, leaving the rest to ``resume``, and so on."""
    check_bare(options.faults, options.bare)
    check_overlap(options.overlap_starts, options.parallel_starts, options.timing_lock)
    check_executor(options)
    check_baseline(options)
    executor = make_executor(options)  # a bad --gpus is refused before host_facts imports torch
    facts = dict(host_facts())
    if options.gpus is not None:
        facts["gpu_count"] = options.gpus
    widest = executor.widest_group(facts["gpu_count"])
    executor.check(c for c in wanted_cases(suites, options) if c.tp <= widest)
    record_lock = threading.Lock()
    tally = _Tally(options.progress)
    run_id = new_run_id()
    outs, jobs = [], []
    held = ExitStack()  # one WriterLock per results file, for the whole run
    for suite in suites:
        per_fault = []
        for fault in options.faults:
            out, js = plan_run(suite, fault, results_root, facts, options, tally.add, record_lock, run_id, held, widest)
            outs.append(out)
            per_fault.append(js)
        jobs += interleaved(per_fault, options.paired) if interleaves(options) else [j for js in per_fault for j in js]
    if options.max_groups is not None:
        jobs = jobs[: options.max_groups]
    t0, started_at = time.monotonic(), utcnow()

    def summarize(stopped_by: Optional[str] = None) -> None:
        """Append this run's RunSummary (also when a signal stops it: what ran so far)."""
        if jobs:
            append_run(
                results_root,
                tally.summary(
                    suites,
                    options,
                    len(jobs),
                    time.monotonic() - t0,
                    stopped_by,
                    machine_label(facts),
                    run_id,
                    started_at,
                    executor.placed_runs,
                ),
            )

    with held, _kill_workers_on_sigterm(on_stop=summarize, record_lock=record_lock):
        executor.run(
            jobs,
            options,
            lambda: options.stop_after_s is not None and time.monotonic() - t0 > options.stop_after_s,
            tally,
        )
    summarize()
    return outs


class _Tally:
    """What a run produced, for its RunSummary."""

    def __init__(self, progress: Optional[Callable[[CaseRecord], None]] = None):
        self.progress = progress
        """Called with every record after it is counted."""
        self.lock = threading.Lock()
        self.statuses: dict[str, int] = {}
        self.case_s = 0.0
        self.engine_starts: dict[tuple, float] = {}
        self.worker_starts = 0
        self.launched = 0
        """Engine groups launched so far."""

    def launch(self, groups: int) -> None:
        with self.lock:
            self.launched += groups

    def add(self, rec: CaseRecord) -> None:
        with self.lock:
            self.statuses[rec.status.value] = self.statuses.get(rec.status.value, 0) + 1
            if rec.status is Status.ok:
                p = rec.provenance
                self.case_s += (p.finished_at - p.started_at).total_seconds()
                start = rec.metrics.get("engine_start_time")
                if start is not None:
                    self.engine_starts[(rec.case.engine_key(), p.fault)] = start.value
        if self.progress:
            self.progress(rec)

    def summary(
        self,
        suites: list[Suite],
        options: RunOptions,
        jobs: int,
        wall_s: float,
        stopped_by: Optional[str],
        machine: str,
        run_id: str,
        started_at,
        executor: Optional[RunPlacement] = None,
    ) -> RunSummary:
        """The run's RunSummary so far (``jobs``: engine groups it meant to run; ``executor``: where
        they went)."""
        return RunSummary(
            suites=[s.name for s in suites],
            faults=list(options.faults),
            parallel_starts=options.parallel_starts,
            overlap_starts=options.overlap_starts,  # check_overlap: only with K > 1
            timing_lock_shared=options.timing_lock is not None,
            engine_groups=self.launched,
            worker_starts=self.worker_starts,
            records=dict(self.statuses),
            wall_s=round(wall_s, 3),
            case_s=round(self.case_s, 3),
            engine_start_s=round(sum(self.engine_starts.values()), 3),
            stopped_early=stopped_by is not None or self.launched < jobs,
            stopped_by=stopped_by,
            specwatch_commit=specwatch_commit(),
            sglang_version=sglang_version(),
            machine=machine,
            run_id=run_id,
            started_at=started_at,
            finished_at=utcnow(),
            executor=executor.model_copy(deep=True) if executor is not None else None,
        )

    def event(self, ev: str) -> None:
        if ev == STARTED_EVENT:
            with self.lock:
                self.worker_starts += 1


def run_suite(suite: Suite, results_root: Path, options: RunOptions = RunOptions()) -> Path:
    """Run one suite; returns the results file of its first fault (``options.faults``). See ``run_suites``."""
    return run_suites([suite], results_root, options)[0]
