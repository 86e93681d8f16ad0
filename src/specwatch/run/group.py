"""One engine group in one child process: launch, watch its lines and its clock, tear it down, record what happened.

A worker that dies or runs past its timeout leaves its case ``crashed`` / ``timeout`` with the
log tail; a fresh worker takes the group's remaining cases.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from pydantic import ValidationError

from specwatch.core import lifeline
from specwatch.core.case import Case
from specwatch.core.process_group import live_members
from specwatch.core.protocol import CaseLine, EngineFacts, Event, MalformedLine, WorkerSpec, parse_line
from specwatch.core.record import CaseRecord, Status, utcnow
from specwatch.core.timing_lock import ENV as TIMING_LOCK_ENV
from specwatch.core.timing_lock import TimingLock
from specwatch.core.turns import ENV as TURNS_ENV
from specwatch.core.turns import SIDE_A, TurnPipes, ends_arg
from specwatch.rules.crashlog import WORKER_DIED, crash_cause, timeout_reason
from specwatch.run.case_records import MALFORMED, failure_record, log_tail, record_from_worker
from specwatch.run.clock import GroupClock
from specwatch.run.engine_starts import run_engine_starts
from specwatch.run.options import RunOptions
from specwatch.run.scratch import scratch_dir
from specwatch.suite import Suite

POLL_S = 1.0
"""How often the parent reads the worker's finished cases."""


WORKER_GRACE_S = 10.0
"""The worker's own deadline (``WorkerSpec.timeout_s``) is the group's plus this: the runner's
clock starts first and normally cuts the group; the worker's is the backstop when it cannot."""


_ACTIVE_WORKERS: set[int] = set()
"""Process groups of running workers (killed when the runner is stopped)."""

STOP_FLUSHES: list[Callable[[], None]] = []
"""What a stopped runner appends before its summary: each in-flight group's records that wait on
a later run of the group (``run.baseline``'s held probed records), measured and otherwise lost."""


STARTED_EVENT = Event.worker_started
"""Runner-side event: a worker process was launched."""


EXITED_EVENT = Event.worker_exited
"""Runner-side event: a worker process ended (it no longer starts or times anything)."""


PROBE_DIR = Path(__file__).resolve().parents[1] / "inject" / "probe"
"""Holds the probe's sitecustomize.py; put first on every worker's PYTHONPATH."""


def run_group(job: "GroupJob", options: RunOptions, on_event: Optional[Callable[[str], None]] = None) -> None:
    """Run one engine group in child processes until every case has a record; ``on_event`` gets
    the worker's event lines (``engine_started``, ``start_lock_held``) as they appear, and the
    runner's own (``worker_started``, ``worker_exited``)."""
    starts = job.suite.spec.suite.engine_starts
    if starts > 1:  # [suite] engine_starts: the group N times, one record per case after the last
        run_engine_starts(job, starts, lambda j: run_once(j, options, on_event))
    else:
        run_once(job, options, on_event)


def run_once(job: "GroupJob", options: RunOptions, on_event: Optional[Callable[[str], None]] = None) -> None:
    """The group's cases on one engine start: a fresh worker after each one that dies."""
    remaining = list(job.cases)
    while remaining:
        remaining = _one_worker(job, options, remaining, on_event or (lambda ev: None))


def _one_worker(
    job: "GroupJob", options: RunOptions, remaining: list[Case], on_event: Callable[[str], None]
) -> list[Case]:
    """One worker process on ``remaining``: record what it finishes and, when it dies or times out
    first, the case it was on (every case when its engine never came up); returns the rest."""
    started = utcnow()
    timeout_s = job.timeout_s or job.suite.spec.suite.timeout_s
    with scratch_dir("specwatch-") as tmp:
        spec, results, log = Path(tmp) / "spec.json", Path(tmp) / "results.jsonl", _log_path(job, remaining, tmp)
        spec.write_text(
            WorkerSpec(
                cases=remaining,
                **worker_timing(job.suite.spec.suite),
                models_dir=str(options.models_dir),
                fault=job.fault,
                probe=job.probe,
                results=str(results),
                timeout_s=timeout_s + WORKER_GRACE_S,
            ).model_dump_json()
        )
        watch = Watch(job, remaining, results, log, GroupClock(timeout_s), on_event, started)
        rc, timed_out = _launch(job, options, spec, log, watch, on_event)
        remaining = [c for c in remaining if c.case_id not in watch.done]
        if not remaining:
            return []
        log_text = log.read_text(errors="replace")
        if timed_out:
            status, reason = Status.timeout, timeout_reason(timeout_s, log_text, watch.clock.queued_s)
        else:
            status = Status.crashed
            reason = WORKER_DIED.format(rc=rc) + crash_cause(log_text)
        # A death before the engine came up hits every case of the group alike.
        died_at_start = not watch.clock.engine_started and not watch.done
        victims = remaining if died_at_start else remaining[:1]
        if died_at_start and len(remaining) > 1:
            reason = "engine start: " + reason
        for victim in victims:
            job.emit(
                failure_record(
                    job.suite, victim, status, reason, log_tail(log_text), job.fault, started, job.probe, watch.at_start
                )
            )
        return [c for c in remaining if c not in victims]


def worker_timing(header) -> dict:
    """The ``WorkerSpec`` fields the suite's ``[suite]`` header sets: repeats, warm-up, windows,
    CI target, step times, core pinning."""
    ci = header.ci_half_width
    return dict(
        repeats=header.repeats,
        warmup=header.warmup,
        min_timed_s=header.min_timed_s,
        ci_half_width=ci,
        max_repeats=header.max_repeats if ci is not None else None,
        step_times=header.step_times,
        pin_cores=header.pin_cores,
    )


def _log_path(job: "GroupJob", remaining: list[Case], tmp: str) -> Path:
    """The worker's log: in the temporary folder, or under ``SPECWATCH_LOG_DIR`` when set."""
    if not os.environ.get("SPECWATCH_LOG_DIR"):
        return Path(tmp) / "log.txt"
    # written there directly, so a run stopped mid-start (SIGTERM, device timeout) keeps it
    keep = Path(os.environ["SPECWATCH_LOG_DIR"])
    keep.mkdir(parents=True, exist_ok=True)
    return keep / (
        f"{job.suite.name}-{remaining[0].case_id}{'-' + job.fault if job.fault else ''}"
        f"{'' if job.probe else '-bare'}.log"
    )


def worker_env(job: "GroupJob", extra_env: Optional[dict]) -> dict:
    """The worker's environment: the probe first on PYTHONPATH, the fault, a bare run's switch."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", **(extra_env or {}))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PROBE_DIR), env.get("PYTHONPATH")) if p)
    if job.fault:
        env["SPECWATCH_FAULT"] = job.fault
    if not job.probe:
        env["SPECWATCH_PROBE"] = "0"  # SGLang's processes run without specwatch code
    return env


def _launch(
    job: "GroupJob", options: RunOptions, spec: Path, log: Path, watch: "Watch", on_event: Callable[[str], None]
) -> tuple[Optional[int], bool]:
    """Start the worker in a process group of its own (setsid) with a lifeline pipe (``core.lifeline``), watch it until
    it exits or its clock runs out, tear it down; returns (exit code, timed out). Whatever goes
    wrong here (a record that cannot be written), the worker's process group is killed first."""
    pipe = lifeline.Pipe()
    env = {**worker_env(job, options.extra_env), **pipe.env()}
    turns = job.turns.take(job.turn_side) if job.turns is not None else None  # the round's first worker only
    if turns is not None:
        env[TURNS_ENV] = ends_arg(turns, job.turn_side)
    proc = None
    try:
        with open(log, "wb") as logf:
            proc = subprocess.Popen(
                [sys.executable, "-m", options.worker_module, str(spec)],
                stdout=logf,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                pass_fds=(pipe.read_fd, *(turns or ())),
            )
        pipe.started()
        if turns is not None:
            job.turns.started(job.turn_side)
        _ACTIVE_WORKERS.add(proc.pid)
        on_event(STARTED_EVENT)
        rc, timed_out = _wait(proc, watch)
        on_event(EXITED_EVENT)  # lets a wave's gate open before teardown waits on the lock
        teardown(proc.pid, env.get(TIMING_LOCK_ENV))
        watch.collect()
        return rc, timed_out
    finally:
        if turns is not None:
            job.turns.started(job.turn_side)  # a worker that never started: the plain loop runs on alone
        if proc is not None:
            finally_kill(proc.pid)
            proc.wait()
            _ACTIVE_WORKERS.discard(proc.pid)
        pipe.close()


def _wait(proc: subprocess.Popen, watch: "Watch") -> tuple[int, bool]:
    """Poll the worker: record its finished cases as they land, kill it when its clock runs out."""
    while True:
        try:
            return proc.wait(timeout=POLL_S), False
        except subprocess.TimeoutExpired:
            watch.collect()
            if watch.clock.expired():
                os.killpg(proc.pid, 9)
                return proc.wait(), True


class Lines:
    """The complete (newline-ended) lines appended to a file since the last call; a line still
    being written waits for the next call, and a torn last line of a dead worker is never read."""

    def __init__(self, path: Path):
        self.path, self._offset, self._partial = path, 0, b""

    def new(self) -> list[str]:
        if not self.path.exists():
            return []
        with open(self.path, "rb") as f:
            f.seek(self._offset)
            data = f.read()
        self._offset += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        return [x.decode(errors="replace") for x in lines if x.strip()]


class Watch:
    """The runner's side of one worker's results file: every line is parsed (``parse_line``) and
    becomes a record, an event, or, malformed, its case's ``failed`` record."""

    def __init__(
        self,
        job: "GroupJob",
        cases: list[Case],
        results: Path,
        log: Path,
        clock: "GroupClock",
        on_event: Callable[[str], None],
        started,
    ):
        self.job, self.cases, self.log, self.clock, self.on_event = job, cases, log, clock, on_event
        self.started, self.lines = started, Lines(results)
        self.by_id = {c.case_id: c for c in cases}
        self.done: set[str] = set()
        self.at_start: Optional[EngineFacts] = None
        """The engine's pool checks (its ``engine_facts`` line), for failure records."""

    def collect(self) -> None:
        """Record every case the worker has finished so far (records land as cases end)."""
        for raw in self.lines.new():
            line = parse_line(raw)
            if isinstance(line, MalformedLine):
                self._malformed(line)
            elif isinstance(line, CaseLine):
                self._case(line)
            else:
                self.clock.on_event(line.event)
                if isinstance(line, EngineFacts):
                    self.at_start = line
                self.on_event(line.event)

    def _case(self, line: CaseLine) -> None:
        case = self.by_id.get(line.case_id)
        if case is None or case.case_id in self.done:
            return
        try:
            rec = record_from_worker(self.job.suite, case, line, self.job.fault, self.job.probe)
        except (ValidationError, ValueError) as e:
            self._malformed(
                MalformedLine(raw=line.model_dump_json(), error=str(e).splitlines()[0], case_id=case.case_id)
            )
            return
        self.job.emit(rec)
        self.done.add(case.case_id)

    def _malformed(self, bad: MalformedLine) -> None:
        """The case the line names (or, naming none, the first unfinished one) is ``failed``."""
        case = self.by_id.get(bad.case_id) if bad.case_id not in self.done else None
        case = case or next((c for c in self.cases if c.case_id not in self.done), None)
        if case is None:
            return
        log_text = self.log.read_text(errors="replace") if self.log.exists() else ""
        tail = log_tail(log_text) + f"\nthe worker's line:\n{bad.raw[:4000]}"
        self.job.emit(
            failure_record(
                self.job.suite,
                case,
                Status.failed,
                (MALFORMED + bad.error)[:2000],
                tail,
                self.job.fault,
                self.started,
                self.job.probe,
                self.at_start,
            )
        )
        self.done.add(case.case_id)


TEARDOWN_WAIT_S = 30.0


def teardown(pgid: int, lock_path: Optional[str]) -> None:
    """Kill what the worker left and wait until its processes are gone. Under parallel starts this
    holds the timing lock exclusively: a dying engine (CUDA context teardown, freed memory) must not
    overlap another engine's timed batch. Zombies do not count as left (``live_members``): an
    orphaned one where init does not reap would hold the wait to its deadline."""
    if not lock_path:
        finally_kill(pgid)
        return
    lock = TimingLock(lock_path)
    lock.exclusive()
    try:
        finally_kill(pgid)
        deadline = time.monotonic() + TEARDOWN_WAIT_S
        while time.monotonic() < deadline and live_members(pgid):
            time.sleep(0.1)
    finally:
        lock.release()


def stop_workers() -> None:
    """Kill every worker and baseline process this runner has running: a paired round's other
    process where the start beside it raised (Ctrl-C; ``--paired`` runs one group at a time)."""
    for pid in list(_ACTIVE_WORKERS):
        finally_kill(pid)


def finally_kill(pgid: int) -> None:
    """Kill whatever the worker left behind (SGLang schedulers, detokenizers)."""
    try:
        os.killpg(pgid, 9)
    except (ProcessLookupError, PermissionError):
        pass


@dataclass
class GroupJob:
    """One engine group of one (suite, fault) run, with the results file its records go to."""

    suite: Suite
    fault: Optional[str]
    cases: list[Case]
    emit: Callable[[CaseRecord], None]
    timeout_s: Optional[int] = None
    """Wall-clock limit for the group; None: the suite's ``timeout_s``."""
    probe: bool = True
    """False: a bare run (no specwatch code in SGLang's processes)."""
    results_file: Optional[Path] = None
    """The results file ``emit`` appends to: its start journal (``run.start_journal``) keeps each
    engine start of a multi-start case as it ends; None: no journal (a job run away from it)."""
    resume: bool = False
    """``--resume``: adopt the journal's unmerged engine starts instead of timing them again."""
    on_start: Optional[Callable[[CaseRecord, int, int], None]] = None
    """``RunOptions.start_progress``: told of each ok engine start of a multi-start case."""
    turns: Optional[TurnPipes] = None
    """``run --paired``: the round's pipes; the group's first worker takes turns through them with
    the process on the other side (the plain loop, or the other ``--fault`` pass; ``core.turns``)."""
    turn_side: str = SIDE_A
    """The worker's side of ``turns``."""

    def run(self, options: RunOptions, on_event: Optional[Callable[[str], None]] = None) -> None:
        run_group(self, options, on_event)
