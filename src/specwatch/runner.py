"""GPU sweep runner: the case loop, one child process per engine group, durable records.

Cases that share every engine-level parameter (``case.ENGINE_FIELDS``) form a group and are run
by one child process (``python -m specwatch.engine_worker``) that starts ``sglang.Engine`` once
and serves all of them. The child reports each case on its own line as it finishes; the parent
turns lines into ``CaseRecord`` s with provenance and appends them durably. When the child dies
(SGLang kills its parent process when a scheduler dies, so it must not be us) or runs past its
timeout, the case it was on is recorded ``crashed`` / ``timeout`` with the log tail, and a fresh
child takes the group's remaining cases.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Optional

from specwatch.case import Backend, Case, ModelSize
from specwatch.provenance import collect, host_facts, machine_label, specwatch_commit
from specwatch.record import CaseRecord, Metric, RunSummary, Status, new_run_id, utcnow
from specwatch.sglang_host import sglang_version
from specwatch.store import append_record, append_run, finished_case_ids, recorded_case_ids, results_path
from specwatch.suite import PlannedCase, Suite, matches
from specwatch.timing_lock import (ENGINE_FACTS_EVENT, ENGINE_STARTED_EVENT, ENV as TIMING_LOCK_ENV, HELD_EVENT,
                                   OVERLAP_ENV, PARALLEL_ENV,
                                   TIMING_EVENT, TimingLock, WaveGate)

LOG_TAIL_LINES = 60
POLL_S = 1.0
"""How often the parent reads the worker's finished cases."""
_ACTIVE_WORKERS: set[int] = set()
"""Process groups of running workers (killed when the runner is stopped)."""
STARTED_EVENT = "worker_started"
"""Runner-side event: a worker process was launched."""
EXITED_EVENT = "worker_exited"
"""Runner-side event: a worker process ended (it no longer starts or times anything)."""
PROBE_DIR = Path(__file__).resolve().parent / "probe"
"""Holds the probe's sitecustomize.py; put first on every worker's PYTHONPATH."""


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


def _tail(text: str, n: int = LOG_TAIL_LINES) -> str:
    return "\n".join(text.splitlines()[-n:])


def record_from_worker(suite: Suite, case: Case, line: dict, fault: Optional[str], probe: bool = True) -> CaseRecord:
    """A worker's per-case JSON line -> CaseRecord with provenance."""
    metrics = {k: Metric(**v) for k, v in line.get("metrics", {}).items()}
    status = Status(line["status"])
    return CaseRecord(
        suite=suite.name, case_id=case.case_id, case=case, status=status,
        reason=line.get("reason") if status is not Status.ok else None,
        log_tail=line.get("log_tail"), metrics=metrics, checks=line.get("checks", {}),
        details=line.get("details", {}),
        provenance=collect(line.get("started_at") or utcnow(), line.get("finished_at") or utcnow(),
                           str(suite.path), suite.sha256, fault, probe),
    )


def failure_record(suite: Suite, case: Case, status: Status, reason: str, log_tail: Optional[str],
                   fault: Optional[str], started, probe: bool = True,
                   at_start: Optional[dict] = None) -> CaseRecord:
    """A case the worker did not finish. ``at_start``: the worker's ``ENGINE_FACTS_EVENT`` line, whose
    structural pool checks hold for every case of the engine, so the record keeps them."""
    at_start = at_start or {}
    return CaseRecord(suite=suite.name, case_id=case.case_id, case=case, status=status, reason=reason,
                      log_tail=log_tail, metrics={k: Metric(**v) for k, v in at_start.get("metrics", {}).items()},
                      checks=at_start.get("checks", {}), details=at_start.get("details", {}),
                      provenance=collect(started, utcnow(), str(suite.path), suite.sha256, fault, probe))


def run_group(suite: Suite, cases: list[Case], timeout_s: int, fault: Optional[str],
              on_record: Callable[[CaseRecord], None], models_dir: Path, extra_env: Optional[dict] = None,
              worker_module: str = "specwatch.engine_worker",
              on_event: Optional[Callable[[str], None]] = None, probe: bool = True) -> None:
    """Run one engine group in child processes until every case has a record; ``on_event`` gets
    the worker's event lines (``engine_started``, ``start_lock_held``) as they appear."""
    remaining = list(cases)
    while remaining:
        started = utcnow()
        with tempfile.TemporaryDirectory(prefix="specwatch-") as tmp:
            spec = Path(tmp) / "spec.json"
            results = Path(tmp) / "results.jsonl"
            log = Path(tmp) / "log.txt"
            if os.environ.get("SPECWATCH_LOG_DIR"):
                # written there directly, so a run stopped mid-start (SIGTERM, device timeout) keeps it
                keep = Path(os.environ["SPECWATCH_LOG_DIR"])
                keep.mkdir(parents=True, exist_ok=True)
                log = keep / f"{suite.name}-{remaining[0].case_id}{'-' + fault if fault else ''}{'' if probe else '-bare'}.log"
            spec.write_text(json.dumps({
                "cases": [c.params() for c in remaining], "repeats": suite.spec.suite.repeats,
                "warmup": suite.spec.suite.warmup, "models_dir": str(models_dir), "fault": fault, "probe": probe,
                "results": str(results),
            }))
            env = dict(os.environ, PYTHONUNBUFFERED="1", **(extra_env or {}))
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PROBE_DIR), env.get("PYTHONPATH")) if p)
            if fault:
                env["SPECWATCH_FAULT"] = fault
            if not probe:
                env["SPECWATCH_PROBE"] = "0"     # SGLang's processes run without specwatch code
            done: set[str] = set()
            by_id = {c.case_id: c for c in remaining}
            seen_lines = 0
            clock = GroupClock(timeout_s)
            at_start: dict = {}              # the engine's pool checks (ENGINE_FACTS_EVENT), for failures

            def collect_new_lines() -> None:
                """Record every case the worker has finished so far (records land as cases end)."""
                nonlocal seen_lines
                if not results.exists():
                    return
                lines = results.read_text().splitlines()
                for raw in lines[seen_lines:]:
                    try:
                        line = json.loads(raw)
                    except json.JSONDecodeError:
                        return  # a line still being written: read it next time
                    seen_lines += 1
                    clock.on_event(line.get("event"))
                    if line.get("event") == ENGINE_FACTS_EVENT:
                        at_start.update(line)
                    if line.get("event") and on_event:
                        on_event(line["event"])
                    case = by_id.get(line.get("case_id"))
                    if case is None or case.case_id in done:
                        continue
                    on_record(record_from_worker(suite, case, line, fault, probe))
                    done.add(case.case_id)

            timed_out = False
            with open(log, "wb") as logf:
                proc = subprocess.Popen([sys.executable, "-m", worker_module, str(spec)],
                                        stdout=logf, stderr=subprocess.STDOUT, env=env,
                                        start_new_session=True)
                _ACTIVE_WORKERS.add(proc.pid)
                if on_event:
                    on_event(STARTED_EVENT)
                while True:
                    try:
                        rc = proc.wait(timeout=POLL_S)
                        break
                    except subprocess.TimeoutExpired:
                        collect_new_lines()
                        if clock.expired():
                            os.killpg(proc.pid, 9)
                            rc, timed_out = proc.wait(), True
                            break
            if on_event:
                on_event(EXITED_EVENT)  # lets a wave's gate open before teardown waits on the lock
            teardown(proc.pid, env.get(TIMING_LOCK_ENV))
            _ACTIVE_WORKERS.discard(proc.pid)
            collect_new_lines()
            remaining = [c for c in remaining if c.case_id not in done]
            if not remaining:
                break
            log_text = log.read_text(errors="replace")
            if timed_out:
                status, reason = Status.timeout, timeout_reason(timeout_s, log_text, clock.queued_s)
            else:
                status = Status.crashed
                reason = WORKER_DIED.format(rc=rc) + crash_cause(log_text)
            # A death before the engine came up hits every case of the group alike.
            died_at_start = not clock.engine_started and not done
            victims = remaining if died_at_start else remaining[:1]
            if died_at_start and len(remaining) > 1:
                reason = "engine start: " + reason
            for victim in victims:
                on_record(failure_record(suite, victim, status, reason, _tail(log_text), fault, started, probe,
                                         at_start))
            remaining = [c for c in remaining if c not in victims]


class GroupClock:
    """A group's timeout clock. It does not run while the worker's engine is up and the worker
    queues for the timing lock (from ``engine_started`` to ``TIMING_EVENT``): under
    ``--parallel-starts`` that wait is other groups' timed batches, not this group's work (on the
    H200 three flashinfer groups of a wave of 10 were cut at 280 s while queued, their engines up)."""

    def __init__(self, timeout_s: float, now: Callable[[], float] = time.monotonic):
        self.timeout_s, self._now = timeout_s, now
        self._t0 = now()
        self._paused_s = 0.0
        self._queued_since: Optional[float] = None
        self.engine_started = False
        """Whether the worker's engine came up (a death before it hits every case of the group)."""

    def on_event(self, event: Optional[str]) -> None:
        if event == ENGINE_STARTED_EVENT and not self.engine_started:
            self.engine_started = True
            self._queued_since = self._now()
        elif event == TIMING_EVENT and self._queued_since is not None:
            self._paused_s += self._now() - self._queued_since
            self._queued_since = None

    @property
    def queued_s(self) -> float:
        """Seconds spent with the engine up, queued for the timing lock (not counted)."""
        return self._paused_s + (self._now() - self._queued_since if self._queued_since is not None else 0.0)

    def elapsed(self) -> float:
        return self._now() - self._t0 - self.queued_s

    def expired(self) -> bool:
        return self.elapsed() > self.timeout_s


TEARDOWN_WAIT_S = 30.0


def teardown(pgid: int, lock_path: Optional[str]) -> None:
    """Kill what the worker left and wait until its processes are gone. Under parallel starts this
    holds the timing lock exclusively: a dying engine (CUDA context teardown, freed memory) must not
    overlap another engine's timed batch."""
    if not lock_path:
        finally_kill(pgid)
        return
    lock = TimingLock(lock_path)
    lock.exclusive()
    try:
        finally_kill(pgid)
        deadline = time.monotonic() + TEARDOWN_WAIT_S
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except (ProcessLookupError, PermissionError):
                break
            time.sleep(0.1)
    finally:
        lock.release()


def finally_kill(pgid: int) -> None:
    """Kill whatever the worker left behind (SGLang schedulers, detokenizers)."""
    try:
        os.killpg(pgid, 9)
    except (ProcessLookupError, PermissionError):
        pass


_PY_EXCEPTION = re.compile(r"^[\w.]*(?:Error|Exception)(?::|$)")
"""A Python exception line as a traceback ends: ``RuntimeError: ...``, ``torch.distributed.X: ...``."""
CPP_FRAME = re.compile(r"^frame #\d+:")
"""A line of a C++ stack trace (``frame #0: c10::Error::Error(...)``): names functions, not a cause."""


def _last_error(log_text: str) -> str:
    """The log's last Python exception line; else its last line that speaks of an error (not a C++
    stack frame: those name ``c10::Error`` after the exception that says what went wrong)."""
    lines = [line.strip() for line in log_text.splitlines()]
    for s in reversed(lines):
        if _PY_EXCEPTION.match(s):
            return s[:500]
    for s in reversed(lines):
        if s and not CPP_FRAME.match(s) and ("Error" in s or "Exception" in s or "Killed" in s or "assert" in s.lower()):
            return s[:500]
    return "no error line in the log"


WORKER_DIED = "worker exited with code {rc} before finishing this case: "
"""Start of a crashed record's reason; the cause found in the log follows."""
WORKER_DIED_RE = re.compile(re.escape(WORKER_DIED).replace(re.escape("{rc}"), "-?\\d+"))
"""``WORKER_DIED`` for any exit code (the dashboard strips it to show causes)."""

_DEVICE_ASSERT = re.compile(r"([\w.+-]+\.(?:cuh|cu|cpp|hpp|h)):(\d+): .*?(\w+)\(.*?Assertion `(.+?)` failed")


def device_assertion(log_text: str) -> Optional[str]:
    """The first CUDA device-side assertion in a worker's log (file:line, kernel, condition, how many
    log lines carry it), or None. Once a kernel asserts, the CUDA context is poisoned and the error
    Python raises comes from whatever ran next (often a cuBLAS call): the assertion is the cause."""
    first, lines = None, 0
    for line in log_text.splitlines():
        m = _DEVICE_ASSERT.search(line)
        if m:
            lines += 1
            first = first or m
    if first is None:
        return None
    path, line_no, kernel, cond = first.groups()
    return (f"device-side assertion in {Path(path).name}:{line_no} {kernel}: `{cond}` failed "
            f"({lines} line{'s' if lines > 1 else ''} of it in the log)")


def crash_cause(log_text: str, device: Optional[str] = None) -> str:
    """Why a worker died, from its log: a device-side assertion first (with the Python error it
    surfaced as), else the last error line. ``device``: ``device_assertion(log_text)`` if the
    caller has it already."""
    last = _last_error(log_text)
    dev = device or device_assertion(log_text)
    return f"{dev}; surfaced as: {last[:200]}" if dev else last


def timeout_reason(timeout_s: int, log_text: str, queued_s: float = 0.0) -> str:
    """A group past its limit (``queued_s``: time not counted, queued for the timing lock); when its
    log shows SGLang had already failed (a device-side assertion, a scheduler exception), say so:
    the timeout is then that failure's teardown, not slowness."""
    reason = f"engine group ran past {timeout_s} s"
    if queued_s >= 1:
        reason += f" (not counting {queued_s:.0f} s queued for the timing lock)"
    dev = device_assertion(log_text)
    if dev or "Scheduler hit an exception" in log_text:
        reason += f"; before that the log shows: {crash_cause(log_text, dev)}"
    return reason


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

    def run(self, models_dir: Path, env: Optional[dict], worker_module: str,
            on_event: Callable[[str], None]) -> None:
        run_group(self.suite, self.cases, self.timeout_s or self.suite.spec.suite.timeout_s, self.fault, self.emit,
                  models_dir, env, worker_module, on_event=on_event, probe=self.probe)


def plan_run(suite: Suite, results_root: Path, facts: dict, emit_progress: Optional[Callable[[CaseRecord], None]],
             resume: bool = False, shard: Optional[Shard] = None, fault: Optional[str] = None,
             where: Optional[dict] = None, record_lock: Optional[threading.Lock] = None, probe: bool = True,
             known_root: Optional[Path] = None, run_id: Optional[str] = None) -> tuple[Path, list[GroupJob]]:
    """Record the suite's skips, return its results file and its engine groups still to run.
    ``known_root``: another results root (e.g. the committed ``results/``) whose records of the
    same machine, SGLang version, suite and fault, of any status, leave their cases out.
    ``run_id``: stamped on every record this run appends (``Provenance.run_id``)."""
    where_in_store = (machine_label(facts), sglang_version(), suite.name, fault, probe)
    out = results_path(results_root, *where_in_store)
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
               gpus: Optional[int] = None, worker_module: str = "specwatch.engine_worker",
               extra_env: Optional[dict] = None, where: Optional[dict] = None,
               parallel_starts: int = 1, stop_after_s: Optional[float] = None,
               group_timeout_s: Optional[int] = None, bare: bool = False,
               known_root: Optional[Path] = None, overlap_starts: bool = False,
               timing_lock: Optional[Path] = None) -> list[Path]:
    """Run every planned case of each suite once per fault (``None``: clean); returns the results
    files. ``parallel_starts`` > 1 starts that many engines at once and times them one at a time
    (``specwatch.timing_lock``); ``stop_after_s`` starts no new group (or wave) after that many
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

    def on_record(rec: CaseRecord) -> None:
        tally.add(rec)
        if progress:
            progress(rec)

    for suite in suites:
        for fault in faults:
            out, js = plan_run(suite, results_root, facts, on_record, resume, shard, fault, where, record_lock,
                               probe=not bare, known_root=known_root, run_id=run_id)
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

    with _kill_workers_on_sigterm(on_stop=summarize):
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


def start_class(case: Case) -> tuple:
    """How slow an engine group is to start, coarsely (seen on the H200s): tiny oracles on triton or
    fa3 start in under a minute; flashinfer compiles kernels on first use (tree kernels for topk > 1
    longest); tp > 1 adds process groups; 1b/8b checkpoints are written and loaded. A wave waits for
    its slowest start, so waves are formed from groups of one class (``wave_order``)."""
    size = {ModelSize.llama_1b: 1, ModelSize.llama_8b: 2}.get(case.model, 0)
    flashinfer = case.attention_backend is Backend.flashinfer
    return (size, case.tp, flashinfer and case.topk > 1, flashinfer)


def wave_order(jobs: list) -> list:
    """Jobs sorted by ``start_class`` of their first case (stable: suite order within a class)."""
    return sorted(jobs, key=lambda j: start_class(j.cases[0]))


def rolling_order(jobs: list) -> list:
    """``--overlap-starts``' queue: each ``start_class`` spread evenly over it, slower classes first on
    ties (suite order within a class). Waves want like with like; a rolling queue wants the opposite:
    a slow start (flashinfer compiling its kernels, ~3 min the first time on a fresh host) ties up
    one slot while the fast groups in the other slots keep the timing lock busy. In ``wave_order``
    the flashinfer groups came last, so at the end of a sweep every slot would be compiling at once
    and nothing timed. The first jobs are one of each class, slowest first, to warm the caches."""
    classes: dict = {}
    for j in jobs:
        classes.setdefault(start_class(j.cases[0]), []).append(j)
    rank = {c: r for r, c in enumerate(sorted(classes))}
    keyed = [((i / len(members), -rank[c]), j) for c, members in classes.items() for i, j in enumerate(members)]
    return [j for _, j in sorted(keyed, key=lambda kj: kj[0])]


def _parallel_env(extra_env: Optional[dict], lock_path: Path, parallel_starts: int, overlap: bool) -> dict:
    env = dict(extra_env or {}, **{TIMING_LOCK_ENV: str(lock_path), PARALLEL_ENV: str(parallel_starts)})
    if overlap:
        env[OVERLAP_ENV] = "1"
    # K engines' processes share the host's cores: keep each one's CPU thread pools small
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // parallel_starts)))
    return env


def _run_rolling(jobs: list, parallel_starts: int, expired, models_dir: Path, extra_env: Optional[dict],
                 worker_module: str, count: Callable[[str], None],
                 on_launch: Callable[[int], None], lock_path: Optional[Path] = None) -> None:
    """``--overlap-starts``: up to ``parallel_starts`` groups in flight, the next one started as soon as
    one ends, in ``rolling_order``, until ``expired()``. Timed batches still exclude each other (the
    lock's exclusive side); starts are not held back from them. The wave design's cost, measured on
    the H200 (tree-page, K = 10): after each wave's last timed batch ~80 s passed before the next
    wave timed (its slowest start ~60 s, spawn and the last engine's teardown the rest), wall time
    2.1-2.7 x the cases' own time. ``lock_path``: a lock other runs share (default: this run's own)."""
    with tempfile.TemporaryDirectory(prefix="specwatch-lock-") as tmp:
        env = _parallel_env(extra_env, lock_path or Path(tmp) / "timing.lock", parallel_starts, overlap=True)
        queue = rolling_order(jobs)
        take = threading.Lock()

        def slot() -> None:
            while True:
                with take:
                    if not queue or expired():
                        return
                    job = queue.pop(0)
                    on_launch(1)
                job.run(models_dir, env, worker_module, count)

        threads = [threading.Thread(target=slot, daemon=True) for _ in range(min(parallel_starts, len(queue)))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()


def _run_waves(jobs: list, parallel_starts: int, expired, models_dir: Path, extra_env: Optional[dict],
               worker_module: str, count: Callable[[str], None],
               on_wave: Callable[[int], None]) -> None:
    """Run ``jobs`` in waves of ``parallel_starts`` (``specwatch.timing_lock``) until ``expired()``;
    ``on_wave`` hears each wave's size as it starts."""
    with tempfile.TemporaryDirectory(prefix="specwatch-lock-") as tmp:
        lock_path = Path(tmp) / "timing.lock"
        env = _parallel_env(extra_env, lock_path, parallel_starts, overlap=False)
        jobs = wave_order(jobs)
        for w in range(0, len(jobs), parallel_starts):
            if expired():
                break
            wave = jobs[w:w + parallel_starts]
            on_wave(len(wave))
            run_wave(wave, lock_path, lambda job, on_event: job.run(
                models_dir, env, worker_module, lambda ev: (count(ev), on_event(ev))))


def run_suite(suite: Suite, results_root: Path, fault: Optional[str] = None, **kw) -> Path:
    """Run one suite (with one fault or none); returns its results file. See ``run_suites``."""
    return run_suites([suite], results_root, faults=(fault,), **kw)[0]


@contextlib.contextmanager
def _kill_workers_on_sigterm(on_stop: Optional[Callable[[str], None]] = None):
    """Workers run in their own sessions (SGLang kills its parent's group when a scheduler dies),
    so a runner stopped by SIGTERM/SIGINT kills them itself; their cases stay unrecorded (resume).
    ``on_stop`` gets the signal's name first (the run's summary is written then)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        for pgid in list(_ACTIVE_WORKERS):
            finally_kill(pgid)
        if on_stop:
            try:
                on_stop(signal.Signals(signum).name)
            except Exception as e:  # noqa: BLE001 - the workers are dead; exit regardless
                print(f"specwatch: run summary not written: {e}", file=sys.stderr)
        os._exit(128 + signum)

    old = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)


def run_wave(groups: list, lock_path: Path, run_one: Callable[[object, Callable[[str], None]], None]) -> None:
    """Run ``groups`` at once, one thread (and worker) each; see ``specwatch.timing_lock``."""
    holding = [threading.Event() for _ in groups]

    def body(i: int) -> None:
        try:
            run_one(groups[i], lambda ev: ev in (HELD_EVENT, EXITED_EVENT) and holding[i].set())
        finally:
            holding[i].set()  # a worker that died before taking the lock must not stall the wave

    with WaveGate(lock_path) as gate:
        threads = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(len(groups))]
        for t in threads:
            t.start()
        for h in holding:
            h.wait()
        gate.open()
    for t in threads:
        t.join()
