"""The worker's entry: read the spec, start one engine, run every case of the group, write one line per case."""

from __future__ import annotations

import json
import os
import time
import traceback
from pathlib import Path

from specwatch.core.case import Case, Workload
from specwatch.core.protocol import metric
from specwatch.core.timing_lock import (
    ENGINE_FACTS_EVENT,
    ENGINE_STARTED_EVENT,
    PARALLEL_ENV,
    WorkerTimingLock,
)
from specwatch.oracle.checkpoints import ensure_models
from specwatch.rules.pools import pool_checks
from specwatch.worker.engine_args import (
    engine_kwargs,
    fit_server_args,
    recorded_kwargs,
    rendezvous_port,
    server_arg_names,
    server_facts,
    sglang_refusal,
)
from specwatch.worker.measure import (
    flush_cache,
    host_load,
    memory_and_leaks,
    now,
    run_case,
    run_multi_turn,
)
from specwatch.worker.near_full import kv_pool_tokens


def main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    cases = [Case(**c) for c in spec["cases"]]
    probe = spec.get("probe", True)       # False: a bare run, no probe in SGLang's processes
    out = open(spec["results"], "a")

    def emit(obj):
        out.write(json.dumps(obj, default=str) + "\n")
        out.flush()
        os.fsync(out.fileno())

    first = cases[0]
    lock = WorkerTimingLock()
    lock.starting(emit)
    t0 = time.perf_counter()
    target, draft = ensure_models(Path(spec["models_dir"]), first.model, first.profile, first.algorithm, device="cuda")
    gen_s = time.perf_counter() - t0
    import sglang

    known = server_arg_names()       # before the clock: the engine imports it anyway
    t0 = time.perf_counter()
    try:
        kwargs = engine_kwargs(first, target, draft, max(c.batch_size for c in cases), kv_pool_tokens(cases))
        kwargs["nccl_port"] = rendezvous_port()     # tp 1 too: its process group has a TCP store
        kwargs, dropped_args = fit_server_args(kwargs, known) if known else (kwargs, [])
        engine = sglang.Engine(**kwargs)
    except Exception as e:
        tail = traceback.format_exc()[-4000:]
        where = sglang_refusal(e)
        status, reason = (("skipped", f"refused by SGLang {getattr(sglang, '__version__', '?')} ({where}): {e}") if where else
                          ("failed", f"engine start: {type(e).__name__}: {e}"))
        for c in cases:
            emit({"case_id": c.case_id, "status": status, "started_at": now(), "finished_at": now(),
                  "reason": reason[:2000], "log_tail": tail})
        return 0
    start_s = time.perf_counter() - t0
    emit({"event": ENGINE_STARTED_EVENT, "engine_start_s": start_s})
    waited_s = lock.timing(emit)
    facts_start = server_facts(engine)
    if probe and "allocator" in facts_start["specwatch"]:
        # the pool layout before any case runs: a crashed or timed-out case still records it
        pool_metrics, pool_verdicts, coverage = pool_checks(facts_start["specwatch"])
        emit({"event": ENGINE_FACTS_EVENT, "metrics": pool_metrics, "checks": pool_verdicts,
              "details": {"pool_coverage_at_start": coverage}})
    for c in cases:
        started = now()
        load_before = host_load()
        try:
            if c.workload is Workload.long_prompt_multi_turn:
                res = run_multi_turn(engine, c, spec["repeats"], spec["warmup"])
            else:
                res = run_case(engine, c, spec["repeats"], spec["warmup"], calibrate=probe)
            if probe:
                mem_metrics, mem_checks, details = memory_and_leaks(engine, c)
            else:   # bare run: no probe in SGLang's processes, so no facts to read (timing baseline)
                mem_metrics, mem_checks, details = {}, {"flush_cache": flush_cache(engine)[0]}, {"bare": True}
            res["metrics"].update(mem_metrics)
            res["metrics"]["engine_start_time"] = metric(start_s, "s", higher_is_better=False)
            res["metrics"]["model_generation_time"] = metric(gen_s, "s")
            res["checks"].update(mem_checks)
            res["details"].update(details)
            res["details"]["sglang_version"] = facts_start.get("version")
            res["details"]["engine_kwargs"] = recorded_kwargs(kwargs)
            res["details"]["host_load"] = {"before": load_before, "after": host_load()}
            if dropped_args:
                res["details"]["engine_args_not_in_this_sglang"] = dropped_args
            if lock.enabled:
                res["details"]["parallel_starts"] = int(os.environ.get(PARALLEL_ENV, "0")) or None
                if lock.overlapping:
                    res["details"]["overlap_starts"] = True     # timed while other engines started
                res["details"]["waited_for_timing_s"] = round(waited_s, 3)
            emit({"case_id": c.case_id, "status": "ok", "started_at": started, "finished_at": now(), **res})
        except Exception as e:
            emit({"case_id": c.case_id, "status": "failed", "started_at": started, "finished_at": now(),
                  "reason": f"{type(e).__name__}: {e}"[:2000], "log_tail": traceback.format_exc()[-4000:]})
    try:
        engine.shutdown()
    except Exception:
        pass
    lock.release()
    return 0


