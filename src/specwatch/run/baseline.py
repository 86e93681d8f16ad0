"""``specwatch run --baseline``: each engine group's probed runs interleaved with plain-loop baselines.

After each engine start of a group (``[suite] engine_starts``, one by default) the runner starts a
baseline process (``python -m specwatch.worker.baseline``) on the group's speculative cases that
are still ok: one ``sglang.Engine`` with the worker's engine arguments, then per case
``flush_cache()``, one warm-up ``generate`` and ``repeats`` timed ``generate`` calls. The group's
runs go ``probed0 baseline0 baseline1 probed1 probed2 baseline2 ...`` on one host: interleaved, as
asv's ``--interleave-rounds`` does, so a drift of the host between rounds hits both kinds alike, and
in serpentine order (``run.engine_starts.round_order``), so a steady drift within the run favours
the plain loop in one round and the probed run in the next instead of one of them every round.
The baseline runs without the probe on ``PYTHONPATH`` and without ``SPECWATCH_*`` variables
(``baseline_env``).

The probed ok records of those cases are held until the group's last baseline run, then appended
with ``baseline_output_throughput`` and ``overhead`` (``store.baseline``) and ``details.baseline``;
a run stopped (SIGTERM, Ctrl-C) or failing before then appends them with the baseline runs that
did finish (a SIGKILL of the runner loses the held records of the group in flight).
A probed record that is not ok goes out at once, without a baseline. A baseline run that crashes,
times out or raises leaves its reason in ``details.baseline`` of its cases: the probed record is
appended either way.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Optional

from pydantic import ValidationError

from specwatch.core import lifeline
from specwatch.core.case import Case, Workload
from specwatch.core.details import BaselineStep
from specwatch.core.placement import ExecutorKind
from specwatch.core.protocol import BaselineLine, BaselineSpec
from specwatch.core.record import CaseRecord, Status
from specwatch.core.turns import SIDE_B, TurnPipes, ends_arg
from specwatch.rules.crashlog import crash_cause
from specwatch.run.engine_starts import round_order, run_engine_rounds, run_turns
from specwatch.run.group import (
    _ACTIVE_WORKERS,
    PROBE_DIR,
    STOP_FLUSHES,
    GroupJob,
    finally_kill,
    run_once,
    stop_workers,
)
from specwatch.run.options import RunOptions
from specwatch.run.scratch import scratch_dir
from specwatch.store.baseline import baseline_metrics


def measures_baseline(case: Case) -> bool:
    """Whether ``--baseline`` times the case: a speculative oracle case of the standard workload
    (the plain loop sends the worker's timed prompts; near-full, multi-turn, serving and own-model
    cases send others)."""
    return case.algorithm.speculative and case.own_model is None and case.workload is Workload.standard


def check_baseline(options: RunOptions) -> None:
    """``--baseline`` (and ``--paired``) with options it cannot go with: a ``ValueError`` of one line."""
    if not options.baseline:
        if options.paired and len(options.faults) != 2:
            raise ValueError(
                "--paired takes turns between two timed engines: give it with --baseline or with two --fault passes"
            )
        if options.paired and (options.parallel_starts > 1 or options.executor is ExecutorKind.ray):
            raise ValueError("--paired runs two engines of one group on one host in turn: drop --parallel-starts / ray")
        return
    if options.bare:
        raise ValueError("--baseline compares the probed run with a plain loop: drop --bare")
    if any(f is not None for f in options.faults):
        raise ValueError("--baseline times clean runs: drop --fault")
    if options.parallel_starts > 1:
        raise ValueError("--baseline alternates one engine at a time with the probed group: drop --parallel-starts")
    if options.executor is not ExecutorKind.local:
        raise ValueError("--baseline alternates on one host's GPUs: give it with --executor local")


def baseline_env(extra_env: Optional[dict]) -> dict:
    """The baseline's environment: the runner's, less every ``SPECWATCH_*`` variable and the probe's
    folder on ``PYTHONPATH``."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", **(extra_env or {}))
    env = {k: v for k, v in env.items() if not k.startswith("SPECWATCH_")}
    path = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != PROBE_DIR]
    env["PYTHONPATH"] = os.pathsep.join(path)
    return env


@dataclass
class BaselineRun:
    """What one baseline process left: a line per case it finished, and why it ended early."""

    lines: dict[str, BaselineLine] = field(default_factory=dict)
    """Case id -> its line."""
    error: Optional[str] = None
    """The process's exit or timeout (None: it ended by itself with code 0)."""


def run_baseline(
    spec: BaselineSpec, module: str, env: dict, timeout_s: float, log: Path, turns: Optional[TurnPipes] = None
) -> BaselineRun:
    """``python -m MODULE SPEC FD PID [TURNS]`` in a process group of its own (SGLang kills its
    parent's group when a scheduler dies), with the worker's lifeline pipe (``core.lifeline``: it dies
    with the runner; the pipe's end and the runner's pid go on its command line, not in its
    environment), killed past ``timeout_s``; returns its lines and its error. ``turns``: a paired
    round's pipes, the plain loop's ends on its command line (``core.turns``)."""
    spec_path = Path(spec.results).with_suffix(".spec.json")
    spec_path.write_text(spec.model_dump_json())
    Path(spec.results).unlink(missing_ok=True)
    pipe = lifeline.Pipe()
    ends = turns.take(SIDE_B) if turns is not None else None
    turn_arg = [ends_arg(ends, SIDE_B)] if ends else []
    try:
        with open(log, "wb") as f:
            proc = subprocess.Popen(
                [sys.executable, "-m", module, str(spec_path), *pipe.argv(), *turn_arg], env=env, stdout=f,
                stderr=subprocess.STDOUT, start_new_session=True, pass_fds=(pipe.read_fd, *(ends or ())),
            )  # fmt: skip
        pipe.started()
        if turns is not None:
            turns.started(SIDE_B)
        _ACTIVE_WORKERS.add(proc.pid)
        try:
            rc = proc.wait(timeout=max(timeout_s, 1.0))
        except subprocess.TimeoutExpired:
            rc = None
        finally:
            finally_kill(proc.pid)
            proc.wait()
            _ACTIVE_WORKERS.discard(proc.pid)
    finally:  # a process that never started is marked started by run_turns when this returns
        pipe.close()
    run = BaselineRun()
    results = Path(spec.results)
    for raw in results.read_text().splitlines() if results.exists() else []:
        try:
            line = BaselineLine.model_validate_json(raw)
        except ValidationError as e:
            run.error = f"malformed baseline line: {str(e).splitlines()[0]}"
            continue
        run.lines[line.case_id] = line
    log_text = log.read_text(errors="replace")
    if rc is None:
        run.error = f"baseline process ran past {timeout_s:.0f} s"
    elif rc != 0:
        run.error = f"baseline process exited with code {rc}: {crash_cause(log_text)}"[:2000]
    return run


def _run_entry(k: int, line: Optional[BaselineLine], error: Optional[str]) -> dict:
    """One baseline run as a case's ``details.baseline`` keeps it."""
    if line is None or not line.ok:
        why = (line.reason if line is not None else None) or error or "the baseline process left no line"
        return {"round": k, "error": why}
    return {
        "round": k,
        "started_at": line.started_at.isoformat() if line.started_at else None,
        "finished_at": line.finished_at.isoformat() if line.finished_at else None,
        "output_throughput": line.output_throughput,
        "cached_tokens": line.cached_tokens,
        **({"batches_per_repeat": line.batches_per_repeat} if line.batches_per_repeat is not None else {}),
        **({"windows_stopped_by": line.windows_stopped_by.value} if line.windows_stopped_by else {}),
        **({"core_pinning": line.core_pinning} if line.core_pinning is not None else {}),
        **({"sglang_step_times": line.sglang_step_times} if line.sglang_step_times is not None else {}),
        **({"sglang_step_distribution": line.sglang_step_distribution} if line.sglang_step_distribution else {}),
        **({"sglang_step_times_error": line.sglang_step_times_error} if line.sglang_step_times_error else {}),
    }


def with_baseline(rec: CaseRecord, entries: list[dict], order: list[str]) -> CaseRecord:
    """``rec`` with ``store.baseline``'s metrics over its baseline runs and ``details.baseline``."""
    metrics = baseline_metrics(rec, [e["output_throughput"] for e in entries if "error" not in e])
    facts: dict = {"order": list(order), "runs": entries}
    if not metrics:
        errors = "; ".join(e["error"] for e in entries if "error" in e) or "no baseline run"
        facts["reason"] = f"no baseline run timed the case: {errors}"[:2000]
    out = rec.model_copy(deep=True)
    out.metrics = {**out.metrics, **metrics}
    out.details["baseline"] = facts
    return out


class BaselineBoard:
    """One group's probed records of baseline cases, held until its last baseline run."""

    def __init__(self, emit: Callable[[CaseRecord], None], cases: list[Case]):
        self.emit = emit
        self.cases = [c for c in cases if measures_baseline(c)]
        self.held: dict[str, CaseRecord] = {}
        self.dropped: set[str] = set()
        """Baseline cases a probed run recorded not ok: no later baseline runs them."""
        self.order: list[str] = []
        self.runs: dict[str, list[dict]] = {}

    def probed_emit(self, rec: CaseRecord) -> None:
        """The probed runs' ``emit``: an ok record of a baseline case is held, any other passes on."""
        if any(c.case_id == rec.case_id for c in self.cases):
            if rec.status is Status.ok:
                self.held[rec.case_id] = rec
                return
            self.dropped.add(rec.case_id)
            self.held.pop(rec.case_id, None)
        self.emit(rec)

    def round(self, k: int, launch: Callable[[list[Case]], BaselineRun], paired: bool = False) -> None:
        """Round ``k``'s baseline run on the cases still ok: right after probed start ``k`` on even
        rounds, right before it on odd ones (``run.engine_starts.round_order``); ``paired``: beside
        it, the two taking turns (``paired{k}``, ``core.turns``)."""
        probed_first = (
            not paired and round_order(k, [BaselineStep.probed, BaselineStep.baseline])[0] is BaselineStep.probed
        )
        if probed_first:  # it ran before this call
            self.order.append(BaselineStep.probed.label(k))
        pending = [c for c in self.cases if c.case_id not in self.dropped]
        run = launch(pending) if pending else None
        if paired:
            self.order.append((BaselineStep.paired if run is not None else BaselineStep.probed).label(k))
        elif run is not None:
            self.order.append(BaselineStep.baseline.label(k))
        if not probed_first and not paired:  # it runs next
            self.order.append(BaselineStep.probed.label(k))
        if run is None:
            return
        for c in pending:
            self.runs.setdefault(c.case_id, []).append(_run_entry(k, run.lines.get(c.case_id), run.error))

    def flush(self) -> None:
        """Append each held record with its baseline."""
        held, self.held = self.held, {}  # once, whether the group's end or a stop's handler gets here first
        for cid, rec in held.items():
            self.emit(with_baseline(rec, self.runs.get(cid, []), self.order))


def _log_path(job: GroupJob, cases: list[Case], tmp: str, k: int) -> Path:
    """The baseline's log: in the temporary folder, or under ``SPECWATCH_LOG_DIR`` when set."""
    if not os.environ.get("SPECWATCH_LOG_DIR"):
        return Path(tmp) / "baseline.log"
    keep = Path(os.environ["SPECWATCH_LOG_DIR"])
    keep.mkdir(parents=True, exist_ok=True)
    return keep / f"{job.suite.name}-{cases[0].case_id}-baseline{k}.log"


def launch(
    job: GroupJob, options: RunOptions, cases: list[Case], k: int, turns: Optional[TurnPipes] = None
) -> BaselineRun:
    """Baseline run ``k`` of ``job``'s ``cases``: the suite's repeats (and its windows and CI
    target, as the probed run's), the group's time limit; ``turns``: a paired round's pipes."""
    header = job.suite.spec.suite
    with scratch_dir("specwatch-baseline-") as tmp:
        spec = BaselineSpec(
            cases=cases,
            repeats=header.repeats,
            models_dir=str(options.models_dir),
            results=str(Path(tmp) / "out.jsonl"),
            min_timed_s=header.min_timed_s,
            ci_half_width=header.ci_half_width,
            max_repeats=header.max_repeats,
            pin_cores=header.pin_cores,
            step_times=header.step_times,
        )
        env = baseline_env(options.extra_env)
        return run_baseline(
            spec, options.baseline_module, env, job.timeout_s or header.timeout_s, _log_path(job, cases, tmp, k), turns
        )


def run_interleaved(job: GroupJob, options: RunOptions, on_event: Optional[Callable[[str], None]] = None) -> None:
    """The group's engine starts, each paired with a baseline run (``BaselineBoard.round``), after
    it on even rounds and before it on odd ones; with ``RunOptions.paired`` beside it, the
    two processes taking turns batch by batch (``core.turns``)."""
    board = BaselineBoard(job.emit, job.cases)
    probed = replace(job, emit=board.probed_emit)
    starts = job.suite.spec.suite.engine_starts
    paired = options.paired

    def beside(k: int, pipes: Optional[TurnPipes] = None) -> None:
        """Round ``k``'s plain loop; with ``pipes`` (``--paired``) beside the probed start, in turns."""
        board.round(k, lambda cases: launch(job, options, cases, k, pipes), pipes is not None)

    def paired_start(pipes: TurnPipes) -> None:
        run_once(replace(probed, turns=pipes), options, on_event)

    STOP_FLUSHES.append(board.flush)  # a SIGTERM exits from its handler: no finally runs then
    try:
        if starts > 1:
            run_engine_rounds([probed], starts, lambda j: run_once(j, options, on_event), beside, stop_workers, paired)
        elif paired:
            run_turns(0, paired_start, functools.partial(beside, 0), stop_workers)
        else:
            run_once(probed, options, on_event)
            beside(0)
    finally:  # a run stopped mid-group (Ctrl-C, an error) still appends what was measured
        STOP_FLUSHES.remove(board.flush)
        board.flush()


@dataclass
class BaselineJob(GroupJob):
    """A ``GroupJob`` whose run interleaves baseline runs with its engine starts (``run_interleaved``)."""

    def run(self, options: RunOptions, on_event: Optional[Callable[[str], None]] = None) -> None:
        run_interleaved(self, options, on_event)
