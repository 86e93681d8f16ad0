"""The serving workload on the worker: per case, SGLang's HTTP server under SGLang's serving benchmark.

Each case of the group gets a server of its own (``worker.serving_server``; the group's engine
arguments, as the offline engine's) so its acceptance and its leak checks cover its own load only:
SGLang's ``avg_spec_accept_length`` counts every verify step since the server started (its own
warm-up request and the benchmark's warm-up included). The benchmark (``worker.serving_bench``)
runs ``repeats`` times as a child process with a timeout; after the last run the worker flushes the
server's cache over HTTP and reads the probe's facts from ``/server_info`` (``worker.memory_facts``,
as for an engine). Everything the server and the benchmark print goes to log files in the group's
scratch folder (beside ``results``, or ``SPECWATCH_LOG_DIR``); a failed case keeps their tails.

A server that does not come up fails every remaining case of the group with its log tail (they
share its arguments); one that SGLang's argument checks refused is ``skipped`` with SGLang's words.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from specwatch.core.case import Case
from specwatch.core.errors import SpecwatchInputError
from specwatch.core.protocol import EngineStarted, WorkerSpec
from specwatch.core.record import Status
from specwatch.rules.release_serving import ServingBenchmark, serving_benchmark_for
from specwatch.rules.releases import running_version
from specwatch.worker import serving_prompts
from specwatch.worker.engine_args import engine_kwargs, fit_server_args, recorded_kwargs, rendezvous_port, server_facts
from specwatch.worker.measure import MetricSet, flush_cache, host_load, now
from specwatch.worker.memory_facts import memory_and_leaks
from specwatch.worker.serving_bench import bench_argv, parse_output, read_output
from specwatch.worker.serving_server import (
    SERVER_MODULE,
    Server,
    ServerDown,
    kill_group,
    log_tail,
    spawn,
    start_server,
)

DEFAULT_TIMEOUT_S = 900.0
"""The group's time when the spec names no deadline (the suites' default ``timeout_s``)."""

SERVER_START_LIMIT_S = 600.0
"""Longest wait for one server to become healthy (seconds), within the group's time left."""

MARGIN_S = 30.0
"""Seconds kept back from the group's time left for the leak checks and the server's shutdown."""

OWN_MODEL_NOT_APPLICABLE = {
    "lossless": "random-id prompts have no expected output (an oracle model's prompts are oracle chains)",
}
"""Checks a serving case of an own model does not make (an oracle model's does), and why."""

NOT_APPLICABLE = {
    "accept_length_matches_oracle": "the server's average acceptance also counts the benchmark's warm-up "
    "request: acceptance is measured, not expected",
    "parity_with_plain": "the benchmark keeps no outputs to compare with the target's",
    "output_digest": "the benchmark keeps no output token ids",
    "decode_watermark_page_aligned": "the benchmark reads /server_info during the load, which takes the "
    "probe's per-batch occupancy with it",
    "step_time": "no verify-step count per request leaves the benchmark (no break-even acceptance)",
}
"""Checks and metrics of the other workloads that this one does not make, and why (``details``)."""

REFUSAL = re.compile(
    r"sglang/srt/(server_args\.py|arg_groups/)[^\n]*\n(?:[^\n]*\n)*?(ValueError|AssertionError|NotImplementedError): "
)
"""A traceback whose frames reach SGLang's argument checks and end in the errors they raise."""


@dataclass
class Group:
    """What every case of a serving group shares."""

    spec: WorkerSpec
    kwargs: dict
    dropped: list
    target: Path
    tokenizer: Path
    bench: ServingBenchmark
    scratch: Path
    gen_s: float
    timed: bool = False
    waited_s: float = 0.0


def scratch_dir(spec: WorkerSpec) -> Path:
    """Where a group's logs and benchmark outputs go: ``SPECWATCH_LOG_DIR`` when set (kept), else
    beside the results file (the runner's temporary folder)."""
    keep = os.environ.get("SPECWATCH_LOG_DIR")
    root = Path(keep) if keep else Path(spec.results).parent
    folder = root / f"serving-{spec.cases[0].case_id}"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def serving_models(spec: WorkerSpec, first: Case) -> tuple[Path, Optional[Path], Path]:
    """(target, draft, tokenizer folder) of the group: an own model's, or the oracle checkpoints
    with the oracle tokenizer beside the target (the server detokenizes its stream)."""
    if first.own_model is not None:
        from specwatch.own.checkpoint import resolve_checkpoint
        from specwatch.worker.own_model import checkpoint_paths

        target, draft = checkpoint_paths(first)
        m = first.own_model
        tok = resolve_checkpoint(m.tokenizer, None, m.name, "tokenizer") if m.tokenizer else target
        return target, draft, tok
    from specwatch.oracle.checkpoints import case_models

    target, draft = case_models(spec.models_dir, first, device="cuda", tokenizer=True)
    return target, draft, target


def server_kwargs(cases: list[Case], target: Path, draft, tokenizer: Path, known: Optional[set]) -> tuple[dict, list]:
    """The group's engine arguments (``engine_kwargs`` at the group's largest batch, fitted to the
    installed release) and the dropped ones; an own model's separate tokenizer as ``tokenizer_path``."""
    from specwatch.worker.near_full import kv_pool_tokens

    kv_tokens = kv_pool_tokens(cases)  # as ``main.start_engine``
    kw = engine_kwargs(cases[0], target, draft, max(c.batch_size for c in cases), kv_tokens)
    if tokenizer != target:
        kw["tokenizer_path"] = str(tokenizer)
    kw["nccl_port"] = 0  # a fresh one per server (``fresh_ports``)
    return fit_server_args(kw, known) if known else (kw, [])


def fresh_ports(kwargs: dict) -> tuple[dict, int]:
    """``kwargs`` with a free rendezvous port, and a free HTTP port apart from it."""
    nccl = rendezvous_port()
    http = rendezvous_port(os.getpid() + 1)
    if http == nccl:
        http = rendezvous_port(os.getpid() + 2)
    return ({**kwargs, "nccl_port": nccl} if "nccl_port" in kwargs else dict(kwargs)), http


def time_left(spec: WorkerSpec, guard) -> float:
    """Seconds the group has left by the worker's deadline (the default group time without one)."""
    return (spec.timeout_s or DEFAULT_TIMEOUT_S) - guard.elapsed()


def refused(log_text: str) -> bool:
    """Whether a server's log shows SGLang's argument checks refusing the case (``REFUSAL``)."""
    return REFUSAL.search(log_text) is not None


def failure(c: Case, status: Status, reason: str, tail: Optional[str], started=None) -> dict:
    """A case line that is not ok."""
    return {
        "case_id": c.case_id,
        "status": status.value,
        "started_at": started or now(),
        "finished_at": now(),
        "reason": reason[:2000],
        "log_tail": tail,
    }


def run_serving(spec: WorkerSpec, emit, guard, lock) -> None:
    """Every case of a serving group, one line each (``emit.case``); the timing lock is taken
    exclusively once the first server is healthy, as the engine workers take it."""
    try:
        group = _setup(spec)
    except Exception as e:
        status = Status.failed
        reason = f"serving setup: {type(e).__name__}: {getattr(e, 'message', None) or e}"
        for c in spec.cases:
            emit.case(failure(c, status, reason, traceback.format_exc()[-4000:]))
        return
    for i, c in enumerate(spec.cases):
        line, server_down = serve_case(group, c, emit, guard, lock)
        emit.case(line)
        if server_down:
            for rest in spec.cases[i + 1 :]:
                emit.case({**line, "case_id": rest.case_id, "started_at": now(), "finished_at": now()})
            return


def _setup(spec: WorkerSpec) -> Group:
    from specwatch.worker.engine_args import server_arg_names

    t0 = time.perf_counter()
    target, draft, tokenizer = serving_models(spec, spec.cases[0])
    gen_s = time.perf_counter() - t0
    try:
        bench = serving_benchmark_for(running_version())
    except SpecwatchInputError as e:
        raise RuntimeError(e.message) from None
    kwargs, dropped = server_kwargs(spec.cases, target, draft, tokenizer, server_arg_names())
    return Group(spec, kwargs, dropped, target, tokenizer, bench, scratch_dir(spec), gen_s)


def serve_case(group: Group, c: Case, emit, guard, lock) -> tuple[dict, bool]:
    """One case: its server up, the benchmark's repeats, the leak checks, the server down.
    Returns (the case's line, whether its server did not come up)."""
    started, load_before = now(), host_load()
    kwargs, port = fresh_ports(group.kwargs)
    log = group.scratch / f"{c.case_id}-server.log"
    t0 = time.perf_counter()
    try:
        server = start_server(kwargs, log, port)
    except Exception as e:  # no command-line form for an argument, no Python to start
        return failure(c, Status.failed, f"server start: {type(e).__name__}: {e}", traceback.format_exc()[-4000:]), True
    try:
        try:
            server.wait_healthy(max(MARGIN_S, min(SERVER_START_LIMIT_S, time_left(group.spec, guard) - MARGIN_S)))
        except ServerDown as e:
            server.stop()
            text = log_tail(log, 20000)
            status = Status.skipped if refused(text) else Status.failed
            return failure(c, status, f"{e}; server log {log}", text[-4000:], started), True
        start_s = time.perf_counter() - t0
        if not group.timed:
            emit(EngineStarted(engine_start_s=start_s))
            with guard.paused():
                group.waited_s = lock.timing(emit)
            group.timed = True
        try:
            res = _measure(group, c, server, guard)
        except Exception as e:
            tail = traceback.format_exc()[-2000:] + "\n--- server log ---\n" + log_tail(log, 2000)
            return failure(c, Status.failed, f"{type(e).__name__}: {e}", tail, started), False
    finally:
        server.stop()
    res["metrics"].put("engine_start_time", start_s, "s", higher_is_better=False)
    res["metrics"].put("model_generation_time", group.gen_s, "s")
    res["details"].update(_case_details(group, c, server, load_before))
    return {"case_id": c.case_id, "status": Status.ok.value, "started_at": started, "finished_at": now(), **res}, False


def _measure(group: Group, c: Case, server: Server, guard) -> dict:
    """The benchmark's repeats on a healthy server, parsed, then the leak checks after the load."""
    dataset = None if c.own_model is not None else serving_prompts.write_dataset(c, group.scratch)
    lines = [run_bench(group, c, server, r, guard, dataset) for r in range(group.spec.repeats)]
    fallback = server_facts(server).get("avg_spec_accept_length") if c.algorithm.speculative else None
    res = parse_output(lines, c, fallback)
    texts = [ln.get("generated_texts") for ln in lines]
    if dataset is not None and all(isinstance(t, list) for t in texts):
        bad = sum(serving_prompts.mismatched_tokens(c, t) for t in texts)
        res["metrics"].put("lossless_mismatches", bad, "tokens", exact=True, higher_is_better=False)
        res["checks"]["lossless"] = bad == 0
    if group.spec.probe:
        mem_metrics, mem_checks, details = memory_and_leaks(server, c)
    else:
        mem_metrics, mem_checks, details = {}, {"flush_cache": flush_cache(server)[0]}, {"bare": True}
    res["metrics"] = MetricSet().merge(res["metrics"]).merge(mem_metrics)
    res["checks"].update(mem_checks)
    res["details"].update(details)
    if res["metrics"].refused:
        res["checks"]["finite_metrics"] = False
        res["details"]["non_finite_metrics"] = res["metrics"].refused
    return res


class BenchFailed(RuntimeError):
    """The serving benchmark exited non-zero, ran past its time, or wrote no result."""


def run_bench(group: Group, c: Case, server: Server, r: int, guard, dataset: Optional[Path] = None) -> dict:
    """Repeat ``r`` of the benchmark as a child process (its own process group, killed past the group's
    time left) on ``dataset`` (``serving_prompts``; None: random ids); its result line."""
    out = group.scratch / f"{c.case_id}-bench-{r}.jsonl"
    log = group.scratch / f"{c.case_id}-bench-{r}.log"
    argv = bench_argv(
        c,
        group.bench.module,
        server.port,
        group.target,
        group.tokenizer,
        out,
        seed=r,
        warmup=group.spec.warmup,
        dataset=dataset,
    )
    limit = max(MARGIN_S, time_left(group.spec, guard) - MARGIN_S)
    log.write_text("$ " + " ".join(argv) + "\n")
    proc = spawn(argv, log)
    try:
        rc = proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        kill_group(proc, grace_s=5.0)
        raise BenchFailed(
            f"{group.bench.module} past {limit:.0f} s (repeat {r}); log {log}:\n{log_tail(log, 1500)}"
        ) from None
    if rc != 0:
        raise BenchFailed(f"{group.bench.module} exited with code {rc} (repeat {r}); log {log}:\n{log_tail(log, 1500)}")
    return read_output(out)


def _case_details(group: Group, c: Case, server: Server, load_before) -> dict:
    """What a serving case's record says about the server, the benchmark and the host."""
    d = {
        "expectation": "measured",
        "not_applicable": {**NOT_APPLICABLE, **(OWN_MODEL_NOT_APPLICABLE if c.own_model is not None else {})},
        "sglang_version": running_version(),
        "server_module": SERVER_MODULE,
        "serving_benchmark": group.bench.module,
        "serving_dataset": "random-ids"
        if c.own_model is not None
        else "random: oracle chains (worker.serving_prompts)",
        "serving_requests": c.serving_requests,
        "max_concurrency": c.batch_size,
        "engine_kwargs": recorded_kwargs({k: v for k, v in group.kwargs.items() if k != "skip_tokenizer_init"}),
        "host_load": {"before": load_before, "after": host_load()},
        "waited_for_timing_s": round(group.waited_s, 3),
    }
    if group.dropped:
        d["engine_args_not_in_this_sglang"] = group.dropped
    return d
