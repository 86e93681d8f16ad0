"""GPU sweep runner: the case loop, one child process per engine group, durable records.

Cases that share every engine-level parameter (``case.ENGINE_FIELDS``) form a group and are run
by one child process (``python -m specwatch.worker``) that starts ``sglang.Engine`` once
and serves all of them. The child reports each case on its own line as it finishes; the parent
turns lines into ``CaseRecord`` s with provenance and appends them durably. When the child dies
(SGLang kills its parent process when a scheduler dies, so it must not be us) or runs past its
timeout, the case it was on is recorded ``crashed`` / ``timeout`` with the log tail, and a fresh
child takes the group's remaining cases.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Optional

from specwatch.core.case import Case
from specwatch.core.record import CaseRecord, RunSummary, Status, new_run_id, utcnow
from specwatch.core.sglang_host import sglang_version
from specwatch.run.group import STARTED_EVENT, GroupJob, failure_record
from specwatch.run.provenance import host_facts, machine_label, specwatch_commit
from specwatch.run.schedule import _kill_workers_on_sigterm, _run_rolling, _run_waves
from specwatch.store.jsonl import (
    WriterLock,
    append_record,
    append_run,
    finished_case_ids,
    recorded_case_ids,
    results_path,
)
from specwatch.suite import PlannedCase, Suite, matches


@dataclass(frozen=True)
class Shard:
    """``--shard I/N``: this process runs engine groups whose index % N == I (1-based I)."""

    index: int
    count: int

    @classmethod
    def parse(cls, text: str) -> "Shard":
        try:
            i, n = (int(x) for x in text.split("/"))
        except ValueError:
            raise ValueError(f"--shard takes I/N (e.g. 1/3), got {text!r}") from None
        if not 1 <= i <= n:
            raise ValueError(f"--shard {text}: need 1 <= I <= N")
        return cls(i, n)


def engine_groups(cases: Iterable[Case]) -> list[list[Case]]:
    """Group cases by engine key, keeping first-seen order; within a group, file order."""
    groups: "OrderedDict[tuple, list[Case]]" = OrderedDict()
    for c in cases:
        groups.setdefault(c.engine_key(), []).append(c)
    return list(groups.values())


def plan_run(suite: Suite, results_root: Path, facts: dict, emit_progress: Optional[Callable[[CaseRecord], None]],
             resume: bool = False, shard: Optional[Shard] = None, fault: Optional[str] = None,
             where: Optional[dict] = None, record_lock: Optional[threading.Lock] = None, probe: bool = True,
             known_root: Optional[Path] = None, run_id: Optional[str] = None,
             writer_locks: Optional[ExitStack] = None) -> tuple[Path, list[GroupJob]]:
    """Record the suite's skips, return its results file and its engine groups still to run.
    ``known_root``: another results root (e.g. the committed ``results/``) whose records of the
    same machine, SGLang version, suite and fault, of any status, leave their cases out.
    ``run_id``: stamped on every record this run appends (``Provenance.run_id``).
    ``writer_locks``: takes the results file's ``WriterLock`` into it (held until it closes)."""
    where_in_store = (machine_label(facts), sglang_version(), suite.name, fault, probe)
    out = results_path(results_root, *where_in_store)
    if writer_locks is not None:
        writer_locks.enter_context(WriterLock(out))
    done = finished_case_ids(out) if resume else set()
    if known_root is not None:
        done |= recorded_case_ids(results_path(known_root, *where_in_store))
    lock = record_lock or threading.Lock()

    def emit(rec: CaseRecord) -> None:
        rec.provenance.run_id = run_id
        with lock:
            append_record(out, rec)
            if emit_progress:
                emit_progress(rec)

    planned: list[PlannedCase] = [p for p in suite.plan()
                                  if not p.duplicate and (not where or matches(p.case, where))]
    runnable: list[Case] = []
    for p in planned:
        if p.case.case_id in done:
            continue
        if p.skip:
            emit(failure_record(suite, p.case, Status.skipped, p.skip, None, fault, utcnow(), probe))
        elif p.case.tp > facts["gpu_count"]:
            emit(failure_record(suite, p.case, Status.skipped,
                                f"host: needs {p.case.tp} GPUs, this host has {facts['gpu_count']}",
                                None, fault, utcnow(), probe))
        else:
            runnable.append(p.case)
    groups = engine_groups(runnable)
    if shard:
        groups = [g for i, g in enumerate(groups) if i % shard.count == shard.index - 1]
    return out, [GroupJob(suite, fault, g, emit, probe=probe) for g in groups]


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


def run_suites(suites: list[Suite], results_root: Path, faults: tuple[Optional[str], ...] = (None,),
               resume: bool = False, shard: Optional[Shard] = None,
               models_dir: Path = Path("/tmp/specwatch-models"),
               progress: Optional[Callable[[CaseRecord], None]] = None, max_groups: Optional[int] = None,
               gpus: Optional[int] = None, worker_module: str = "specwatch.worker",
               extra_env: Optional[dict] = None, where: Optional[dict] = None,
               parallel_starts: int = 1, stop_after_s: Optional[float] = None,
               group_timeout_s: Optional[int] = None, bare: bool = False,
               known_root: Optional[Path] = None, overlap_starts: bool = False,
               timing_lock: Optional[Path] = None) -> list[Path]:
    """Run every planned case of each suite once per fault (``None``: clean); returns the results
    files. ``parallel_starts`` > 1 starts that many engines at once and times them one at a time
    (``specwatch.core.timing_lock``); ``stop_after_s`` starts no new group (or wave) after that many
    seconds, leaving the rest to ``--resume``; ``group_timeout_s`` overrides the suites' per-group limit
    (a group past it is recorded ``timeout`` with its log tail, unlike one cut by SIGTERM). ``bare``
    runs SGLang without specwatch's probe (records in ``SUITE+bare``): the harness-overhead baseline.
    ``known_root``: cases recorded there already (any status) are left out (``plan_run``).
    ``overlap_starts`` (with ``parallel_starts`` > 1): no waves, K groups in flight (``_run_rolling``);
    ``timing_lock`` (with it): a lock file that concurrent runs share, e.g. one per installed SGLang
    version on one host, so no two timed batches of any of them overlap."""
    check_bare(faults, bare)
    check_overlap(overlap_starts, parallel_starts, timing_lock)
    facts = dict(host_facts())
    if gpus is not None:
        facts["gpu_count"] = gpus
    record_lock = threading.Lock()
    outs, jobs = [], []
    tally = _Tally()
    run_id = new_run_id()
    held = ExitStack()          # one WriterLock per results file, for the whole run

    def on_record(rec: CaseRecord) -> None:
        tally.add(rec)
        if progress:
            progress(rec)

    for suite in suites:
        for fault in faults:
            out, js = plan_run(suite, results_root, facts, on_record, resume, shard, fault, where, record_lock,
                               probe=not bare, known_root=known_root, run_id=run_id, writer_locks=held)
            outs.append(out)
            jobs += js
    if max_groups is not None:
        jobs = jobs[:max_groups]
    for job in jobs:
        job.timeout_s = group_timeout_s
    t0, started_at = time.monotonic(), utcnow()
    expired = lambda: stop_after_s is not None and time.monotonic() - t0 > stop_after_s  # noqa: E731

    def summarize(stopped_by: Optional[str] = None) -> None:
        """Append this run's RunSummary (also when a signal stops it: what ran so far)."""
        if jobs:
            append_run(results_root, RunSummary(
                suites=[s.name for s in suites], faults=list(faults), parallel_starts=parallel_starts,
                overlap_starts=overlap_starts,         # check_overlap: only with K > 1
                timing_lock_shared=timing_lock is not None,
                engine_groups=tally.launched, worker_starts=tally.worker_starts, records=dict(tally.statuses),
                wall_s=round(time.monotonic() - t0, 3), case_s=round(tally.case_s, 3),
                engine_start_s=round(sum(tally.engine_starts.values()), 3),
                stopped_early=stopped_by is not None or tally.launched < len(jobs), stopped_by=stopped_by,
                specwatch_commit=specwatch_commit(), sglang_version=sglang_version(), machine=machine_label(facts),
                run_id=run_id, started_at=started_at, finished_at=utcnow()))

    with held, _kill_workers_on_sigterm(on_stop=summarize):
        if parallel_starts <= 1:
            for job in jobs:
                if expired():
                    break
                tally.launch(1)
                job.run(models_dir, extra_env, worker_module, tally.event)
        elif overlap_starts:
            _run_rolling(jobs, parallel_starts, expired, models_dir, extra_env, worker_module, tally.event,
                         on_launch=tally.launch, lock_path=timing_lock)
        else:
            _run_waves(jobs, parallel_starts, expired, models_dir, extra_env, worker_module, tally.event,
                       on_wave=tally.launch)
    summarize()
    return outs


class _Tally:
    """What a run produced, for its RunSummary."""

    def __init__(self):
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

    def event(self, ev: str) -> None:
        if ev == STARTED_EVENT:
            with self.lock:
                self.worker_starts += 1


def run_suite(suite: Suite, results_root: Path, fault: Optional[str] = None, **kw) -> Path:
    """Run one suite (with one fault or none); returns its results file. See ``run_suites``."""
    return run_suites([suite], results_root, faults=(fault,), **kw)[0]
