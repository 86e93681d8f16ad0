"""The worker's entry: read the spec, start one engine, run every case of the group, write one line per case."""

from __future__ import annotations

import os
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from pydantic import BaseModel, ValidationError

from specwatch.core import lifeline
from specwatch.core.case import Case, Workload
from specwatch.core.errors import SpecwatchInputError
from specwatch.core.protocol import CaseLine, EngineFacts, EngineStarted, WorkerSpec, dump_line
from specwatch.core.record import Status
from specwatch.core.timing_lock import PARALLEL_ENV, WorkerTimingLock
from specwatch.core.turns import process_turns
from specwatch.inject.faults import PLAN_ENV
from specwatch.oracle.checkpoints import case_models
from specwatch.rules.case_totals import CASE_TOTALS
from specwatch.rules.pools import pool_checks
from specwatch.rules.releases import FaultNotInRelease, fault_plan, running_version
from specwatch.worker.cpu_readings import CpuReader, scheduler_of
from specwatch.worker.engine_args import (
    engine_kwargs,
    fit_server_args,
    recorded_kwargs,
    rendezvous_port,
    server_arg_names,
    server_facts,
    sglang_refusal,
)
from specwatch.worker.measure import MetricSet, flush_cache, host_load, now, run_case
from specwatch.worker.memory_facts import memory_and_leaks
from specwatch.worker.multi_turn import run_multi_turn
from specwatch.worker.near_full import kv_pool_tokens
from specwatch.worker.own_model import case_prompts, checkpoint_paths, run_own_case
from specwatch.worker.parity import PlainRun, plain_outputs
from specwatch.worker.pinning import pin_cores
from specwatch.worker.serving import run_serving
from specwatch.worker.step_times import StepWindow
from specwatch.worker.step_times import enable as enable_step_times
from specwatch.worker.windows import RepeatPlan

FAULT_ENV = "SPECWATCH_FAULT"
"""Environment variable the probe applies a fault from (``inject/probe/sitecustomize.py``)."""


class Emitter:
    """Appends lines to the results file durably (flush + fsync), one JSON object per line."""

    def __init__(self, path: str):
        self._out = open(path, "a")

    def __call__(self, line: BaseModel | dict) -> None:
        self._out.write(dump_line(line) + "\n")
        self._out.flush()
        os.fsync(self._out.fileno())

    def case(self, line: dict) -> None:
        """A case's line, checked against ``CaseLine`` first: one that would not validate is
        reported as the case's failure (the validation error as the reason) instead."""
        try:
            CaseLine.model_validate(line)
        except ValidationError as e:
            line = {
                "case_id": line.get("case_id"),
                "status": Status.failed.value,
                "started_at": line.get("started_at"),
                "finished_at": now(),
                "reason": f"worker line refused: {e}"[:2000],
                "log_tail": dump_line(line)[-4000:],
            }
        self(line)


@dataclass
class Engine:
    """A started engine and what its cases' records say about it."""

    engine: object
    kwargs: dict
    """The engine's keyword arguments (recorded with sensitive paths left out)."""
    dropped_args: list
    """Arguments the installed SGLang does not know (left out)."""
    start_s: float
    gen_s: float
    """Seconds spent writing or finding the oracle checkpoints."""
    facts_start: dict = field(default_factory=dict)
    waited_s: float = 0.0
    """Seconds queued for the timing lock."""
    plain: Optional[PlainRun] = None
    """An own model's outputs without speculation (``worker.parity``; None: an oracle model)."""
    step_source: Optional[object] = None
    """Where the release records its step times (``rules.release_step_times``), with ``step_times``."""
    pinning: Optional[dict] = None
    """``details.core_pinning`` (``worker.pinning``), with ``pin_cores``."""


def main(spec_path: str, child: bool = False) -> int:
    """Run the spec's engine group. ``child``: this process is the runner's worker, so it arms
    ``core.lifeline`` (dies with the runner, and past the spec's own timeout)."""
    spec = WorkerSpec.model_validate_json(Path(spec_path).read_text())
    guard = lifeline.hold(spec.timeout_s) if child else lifeline.Lifeline(None, None)
    emit = Emitter(spec.results)
    if spec.fault != (os.environ.get(FAULT_ENV) or None):
        reason = (
            f"spec fault {spec.fault!r} but {FAULT_ENV}={os.environ.get(FAULT_ENV)!r}: the probe applies "
            f"the environment's, so the records would name the wrong fault"
        )
        _report_all(emit, spec.cases, Status.failed, reason, None)
        return 0
    if spec.fault and not plan_fault(spec, emit):
        return 0
    lock = WorkerTimingLock()
    lock.starting(emit)
    if spec.cases[0].workload is Workload.serving:  # an HTTP server per case, not an engine
        run_serving(spec, emit, guard, lock)
        lock.release()
        return 0
    run = start_engine(spec, emit)
    if run is None:
        return 0
    with guard.paused():
        run.waited_s = lock.timing(emit)
    if spec.pin_cores:
        run.pinning = pin_cores()
    with process_turns().hold():
        run.facts_start = server_facts(run.engine)
    if spec.probe and "allocator" in run.facts_start["specwatch"]:
        # the pool layout before any case runs: a crashed or timed-out case still records it
        pool_metrics, pool_verdicts, coverage = pool_checks(run.facts_start["specwatch"])
        emit(EngineFacts(metrics=pool_metrics, checks=pool_verdicts, details={"pool_coverage_at_start": coverage}))
    for c in spec.cases:
        emit.case(run_one(spec, run, c, lock))
    process_turns().last_unit(lambda: run.engine.shutdown())  # a paired baseline times nothing meanwhile
    lock.release()
    return 0


def plan_fault(spec: WorkerSpec, emit: Emitter) -> bool:
    """Make the spec's fault's plan for the installed SGLang release and hand it to the probe of
    every SGLang process this worker starts (``PLAN_ENV``; this process's probe too). A release with
    no edit for the fault gets every case ``skipped`` with the adapter's reason, an unknown release
    every case ``failed`` naming it: neither is run and read as "not caught". False: nothing to run."""
    import sys

    try:
        plan = fault_plan(spec.fault, running_version())
    except FaultNotInRelease as e:
        _report_all(emit, spec.cases, Status.skipped, e.message, None)
        return False
    except SpecwatchInputError as e:
        _report_all(emit, spec.cases, Status.failed, f"fault {spec.fault}: {e.message}", None)
        return False
    os.environ[PLAN_ENV] = plan.to_json()
    probe = sys.modules.get("sitecustomize")
    if probe is not None and hasattr(probe, "_register_fault"):
        probe._register_fault(os.environ[PLAN_ENV])
    return True


def _report_all(emit: Emitter, cases: list[Case], status: Status, reason: str, tail: Optional[str]) -> None:
    for c in cases:
        emit.case(
            {
                "case_id": c.case_id,
                "status": status.value,
                "started_at": now(),
                "finished_at": now(),
                "reason": reason[:2000],
                "log_tail": tail,
            }
        )


def start_engine(spec: WorkerSpec, emit: Emitter) -> Optional[Engine]:
    """Write the oracle models and start ``sglang.Engine`` for the group; on a refusal or error,
    report every case (``skipped`` where SGLang's own checks refused it) and return None."""
    cases, first = spec.cases, spec.cases[0]
    t0 = time.perf_counter()
    if first.own_model is not None:
        target, draft = checkpoint_paths(first)
    else:
        target, draft = case_models(spec.models_dir, first, device="cuda")
    gen_s = time.perf_counter() - t0
    import sglang

    known = server_arg_names()  # before the clock: the engine imports it anyway
    t0 = time.perf_counter()
    try:
        kv_tokens = kv_pool_tokens(cases)
        kwargs = engine_kwargs(first, target, draft, max(c.batch_size for c in cases), kv_tokens)
        kwargs["nccl_port"] = rendezvous_port()  # tp 1 too: its process group has a TCP store
        step_source = enable_step_times(running_version(), kwargs) if spec.step_times else None
        kwargs, dropped_args = fit_server_args(kwargs, known) if known else (kwargs, [])
        plain = plain_outputs(sglang.Engine, kwargs, cases, lambda c: case_prompts(c)[0]) if first.own_model else None
        engine = sglang.Engine(**kwargs)
    except Exception as e:
        where = sglang_refusal(e)
        status, reason = (
            (Status.skipped, f"refused by SGLang {getattr(sglang, '__version__', '?')} ({where}): {e}")
            if where
            else (Status.failed, f"engine start: {type(e).__name__}: {e}")
        )
        _report_all(emit, cases, status, reason, traceback.format_exc()[-4000:])
        return None
    start_s = time.perf_counter() - t0
    emit(EngineStarted(engine_start_s=start_s))
    return Engine(engine, kwargs, dropped_args, start_s, gen_s, plain=plain, step_source=step_source)


def run_one(spec: WorkerSpec, run: Engine, c: Case, lock: WorkerTimingLock) -> dict:
    """One case on the started engine -> its line (``ok``, or ``failed`` with the traceback)."""
    started = now()
    load_before = host_load()
    plain_case = c.own_model is None and c.workload is not Workload.long_prompt_multi_turn
    window = StepWindow(run.engine, running_version(), run.step_source) if spec.step_times and plain_case else None
    turns = process_turns()  # a paired baseline's turns (core.turns): every engine call inside one
    try:
        if c.own_model is not None:
            with turns.hold():
                res = run_own_case(run.engine, c, spec.repeats, spec.warmup, run.plain)
        elif c.workload is Workload.long_prompt_multi_turn:
            with turns.hold():
                res = run_multi_turn(run.engine, c, spec.repeats, spec.warmup)
        else:
            plan, start = RepeatPlan.of_spec(spec), window.start if window else None
            reader = CpuReader(*scheduler_of(run.pinning)) if spec.step_times else None
            res = run_case(run.engine, c, spec.repeats, spec.warmup, spec.probe, plan, start, reader)
            if reader is not None:
                res["details"]["timed_cpu"] = reader.details()
        with turns.hold():
            if spec.probe:
                mem_metrics, mem_checks, details = memory_and_leaks(run.engine, c)
            else:  # bare run: no probe in SGLang's processes, so no facts to read (timing baseline)
                mem_metrics, mem_checks, details = {}, {"flush_cache": flush_cache(run.engine)[0]}, {"bare": True}
            metrics = MetricSet().merge(res["metrics"]).merge(mem_metrics)
            if window is not None:  # after the probe's read: it alone may reset the probe's counts
                repeats = res["details"].get("timed_windows", {}).get("repeats", spec.repeats)
                step_metrics, res["details"]["sglang_step_times"] = window.finish(
                    len(res["details"]["prompt_starts"]), repeats
                )
                metrics.merge(step_metrics)
            elif spec.step_times:
                res["details"]["sglang_step_times"] = {"error": "not measured for own-model or multi-turn cases"}
        if not RepeatPlan.of_spec(spec).fixed:  # the windows decide how many batches ran
            for name in set(CASE_TOTALS) & set(metrics):
                metrics[name] = {**metrics[name], "exact": False}
        if turns.paired:
            res["details"]["turns"] = turns.details()
        metrics.put("engine_start_time", run.start_s, "s", higher_is_better=False)
        metrics.put("model_generation_time", run.gen_s, "s")
        res["metrics"] = metrics
        res["checks"].update(mem_checks)
        res["details"].update(details)
        _engine_details(res["details"], run, lock, load_before)
        if metrics.refused:
            # a NaN or infinite number has no JSON form: name the metric instead of storing null
            res["checks"]["finite_metrics"] = False
            res["details"]["non_finite_metrics"] = metrics.refused
        return {"case_id": c.case_id, "status": Status.ok.value, "started_at": started, "finished_at": now(), **res}
    except Exception as e:
        return {
            "case_id": c.case_id,
            "status": Status.failed.value,
            "started_at": started,
            "finished_at": now(),
            "reason": f"{type(e).__name__}: {e}"[:2000],
            "log_tail": traceback.format_exc()[-4000:],
        }


def _engine_details(details: dict, run: Engine, lock: WorkerTimingLock, load_before) -> None:
    """What every case's record says about the engine and the host it ran on."""
    details["sglang_version"] = run.facts_start.get("version")
    details["engine_kwargs"] = recorded_kwargs(run.kwargs)
    details["host_load"] = {"before": load_before, "after": host_load()}
    if run.dropped_args:
        details["engine_args_not_in_this_sglang"] = run.dropped_args
    if run.pinning is not None:
        details["core_pinning"] = run.pinning
    if lock.enabled:
        details["parallel_starts"] = int(os.environ.get(PARALLEL_ENV, "0")) or None
        if lock.overlapping:
            details["overlap_starts"] = True  # timed while other engines started
        details["waited_for_timing_s"] = round(run.waited_s, 3)
