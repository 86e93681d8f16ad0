"""One engine group in one child process: launch, watch its lines and its clock, tear it down, record what happened.

A worker that dies or runs past its timeout leaves its case ``crashed`` / ``timeout`` with the
log tail; a fresh worker takes the group's remaining cases.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from specwatch.core.case import Case
from specwatch.core.record import CaseRecord, Metric, Status, utcnow
from specwatch.core.timing_lock import (
    ENGINE_FACTS_EVENT,
    ENGINE_STARTED_EVENT,
    TIMING_EVENT,
    TimingLock,
)
from specwatch.core.timing_lock import ENV as TIMING_LOCK_ENV
from specwatch.rules.crashlog import WORKER_DIED, crash_cause, timeout_reason
from specwatch.run.provenance import collect
from specwatch.suite import Suite

LOG_TAIL_LINES = 60


POLL_S = 1.0
"""How often the parent reads the worker's finished cases."""


_ACTIVE_WORKERS: set[int] = set()
"""Process groups of running workers (killed when the runner is stopped)."""


STARTED_EVENT = "worker_started"
"""Runner-side event: a worker process was launched."""


EXITED_EVENT = "worker_exited"
"""Runner-side event: a worker process ended (it no longer starts or times anything)."""


PROBE_DIR = Path(__file__).resolve().parents[1] / "inject" / "probe"
"""Holds the probe's sitecustomize.py; put first on every worker's PYTHONPATH."""


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
              worker_module: str = "specwatch.worker",
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
