"""``python -m specwatch.worker.baseline SPEC.json [FD PID]``: the baseline, a plain loop of ``sglang.Engine.generate``.

One ``sglang.Engine`` with specwatch's own engine arguments for the group (``engine_kwargs`` as the
worker computes them: the same pool, batch size, CUDA graphs and sampling; with the suite's
``step_times`` SGLang's own step-time recording as the probed engine has it, read through
``Engine.get_server_info()`` around each case's timed window), then per case: ``flush_cache()``, one
warm-up ``generate``, then ``repeats`` timed ``generate`` calls on the worker's timed prompts; with
the suite's ``min_timed_s`` / ``ci_half_width`` each repeat is a window of calls and repeats go on
to the CI target, as the probed run's (``windowed``), so the two spreads measure the same thing.
Each timed call prefills its prompts in full, as the probed run's timed batch does
(``fresh_batch``): before it, outside the timed window, the radix cache is flushed and, where
``worker.measure.warm_after_flush`` holds, an untimed prefill-only batch on other chain starts
refills the CUDA allocator the flush emptied. Nothing else runs between timed calls. The runner
starts it without the probe on ``PYTHONPATH`` and without ``SPECWATCH_*`` variables
(``run.baseline.baseline_env``), so SGLang's processes carry no specwatch code; with the suite's
``pin_cores`` it pins them and itself after the engine starts, from the outside, as the worker does
(``worker.pinning.pin_cores``), so both loops run on the same core layout; this module imports
nothing of specwatch at module level, since SGLang's spawned processes import the main module again.
One ``BaselineLine`` per case goes to the spec's ``results`` file.
"""

from __future__ import annotations

import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional


def plain_loop(engine, case, repeats: int, flushed: bool = False, plan=None, window=None) -> dict:
    """The plain loop on a started engine: output tokens/s and radix-cache tokens of each timed
    repeat. ``plan``: a ``worker.windows.RepeatPlan`` with windows or a CI target (``windowed``);
    without one a repeat is one timed batch. ``window``: a ``worker.step_times.StepWindow`` read
    right before the first timed repeat and after the last (``sglang_step_times``). ``flushed``:
    then the flushed pattern on the same engine (each timed batch after a flush, a prefill-only
    batch and a second flush), as ``flushed_output_throughput``."""
    from specwatch.core.turns import process_turns
    from specwatch.oracle.predict import Oracle
    from specwatch.oracle.prompts import timed_tag
    from specwatch.oracle.shapes import SHAPES
    from specwatch.worker.engine_args import greedy_sampling
    from specwatch.worker.measure import Prompts, flush_cache

    prompts, sp = Prompts(case, Oracle(SHAPES[case.model], 0, case.profile)), greedy_sampling(case)

    def timed(batch) -> tuple[float, int]:
        tokens, wall, cached = timed_call(engine, batch, sp)
        return tokens / wall, cached

    turns = process_turns()  # a paired run's turns (core.turns): every engine call inside one
    with turns.hold():
        engine.flush_cache()
        engine.generate(input_ids=prompts.batch("warmup")[0], sampling_params=sp)
        if window is not None:
            window.start()
    out: dict = {"output_throughput": [], "cached_tokens": []}
    if plan is not None and not plan.fixed:
        out.update(windowed(engine, prompts, sp, plan))
    else:
        for r in range(repeats):
            with turns.hold():
                tps, cached = timed(fresh_batch(engine, prompts, sp, r))
            out["output_throughput"].append(tps)
            out["cached_tokens"].append(cached)
    if window is not None:
        with turns.hold():
            batches = sum(out.get("batches_per_repeat") or [repeats])
            out.update(window_step_times(window, batches, len(out["output_throughput"])))
    if not flushed:
        return out
    out["flushed_output_throughput"], out["flushed_cached_tokens"] = [], []
    for r in range(repeats):
        with turns.hold():
            flush_cache(engine)
            engine.generate(input_ids=prompts.batch(f"prefill{r}")[0], sampling_params={**sp, "max_new_tokens": 1})
            flush_cache(engine)
            tps, cached = timed(prompts.batch(timed_tag(r))[0])
        out["flushed_output_throughput"].append(tps)
        out["flushed_cached_tokens"].append(cached)
    return out


def window_step_times(window, timed_batches: int, repeats: int) -> dict:
    """``BaselineLine``'s step-time fields from a finished ``StepWindow``: each quantile's value
    over the window and the window's distribution, or why there is none."""
    from specwatch.worker.step_times import QUANTILES

    metrics, details = window.finish(timed_batches, repeats)
    got = {name: float(metrics[name]["value"]) for name in QUANTILES if name in metrics}
    if not got:
        return {"sglang_step_times_error": str(details.get("error", "no step time recorded"))}
    return {"sglang_step_times": got, "sglang_step_distribution": details.get("distribution_ms")}


def fresh_batch(engine, prompts, sp: dict, r: int) -> list[list[int]]:
    """The timed prompts of call ``r`` (``timed_tag(r)``), readied so that the radix cache serves
    none of them: a flush (``worker.measure.flush_cache``, which retries while SGLang refuses),
    then, where ``worker.measure.warm_after_flush`` holds, the probed repeat's untimed refill
    (``worker.measure.refill_allocator``: a prefill-only batch on chain starts disjoint from the
    timed ones) for the CUDA allocator the flush emptied.

    Calls back to back would be served from the cache: the tiny oracle has 256 chain starts, and
    at batch 8 and 16 the plain loop's windows read 13-24% of their prompt tokens from it
    (``cached_tokens`` in ``details.baseline`` of ``bf707c02b1ca@20261206T060926Z`` and
    ``8fa79f993a7d@20261206T060945Z``), prefill the probed run's timed batch does in full."""
    from specwatch.oracle.prompts import timed_tag
    from specwatch.worker.measure import flush_cache, refill_allocator, warm_after_flush

    batch, _, starts = prompts.batch(timed_tag(r))
    flush_cache(engine)
    if warm_after_flush(prompts.case):
        refill_allocator(engine, prompts, sp, r, set(starts))
    return batch


def timed_call(engine, batch, sp: dict) -> tuple[int, float, int]:
    """One timed ``generate`` of ``batch``: its output tokens, wall seconds and radix-cache tokens."""
    t = time.perf_counter()
    outs = engine.generate(input_ids=batch, sampling_params=sp)
    wall = time.perf_counter() - t
    return sum(len(o["output_ids"]) for o in outs), wall, sum(int(o["meta_info"].get("cached_tokens", 0)) for o in outs)


def windowed(engine, prompts, sp: dict, plan) -> dict:
    """Repeats as the probed run makes them (``worker.windows.RepeatLoop``): each repeat timed
    ``generate`` calls, each on a batch of fresh prompts readied by ``fresh_batch``, until their
    wall seconds reach ``plan.min_timed_s``; repeats until the CI target or ``plan.max_repeats``; in
    a paired round, windows and repeats that end with the probed worker's (``core.turns``).
    Its throughput is the repeat's output tokens over its calls' wall seconds."""
    from specwatch.worker.windows import RepeatLoop

    calls: list[tuple[int, float, int]] = []  # (output tokens, wall s, cached tokens) per call

    def one_batch() -> float:
        calls.append(timed_call(engine, fresh_batch(engine, prompts, sp, len(calls)), sp))
        return calls[-1][1]

    loop, tps, cached = RepeatLoop(plan), [], []

    def samples() -> list[float]:
        i = sum(loop.batches[: len(tps)])
        for n in loop.batches[len(tps) :]:
            w = calls[i : i + n]
            tps.append(sum(c[0] for c in w) / sum(c[1] for c in w))
            cached.append(sum(c[2] for c in w))
            i += n
        return tps

    loop.run(one_batch, samples, None)
    samples()
    return {
        "output_throughput": tps,
        "cached_tokens": cached,
        "batches_per_repeat": list(loop.batches),
        "windows_stopped_by": loop.stopped_by.value if loop.stopped_by else None,
    }


def start_engine(cases: list, models_dir: str, step_times: bool = False):
    """``sglang.Engine`` for the group with the worker's engine arguments (``worker.main.start_engine``
    less the probe's reads), and a ``StepWindow`` maker where ``step_times`` turned SGLang's own
    step-time recording on (None otherwise)."""
    import sglang

    from specwatch.oracle.checkpoints import case_models
    from specwatch.rules.releases import running_version
    from specwatch.worker.engine_args import engine_kwargs, fit_server_args, rendezvous_port, server_arg_names
    from specwatch.worker.near_full import kv_pool_tokens
    from specwatch.worker.step_times import StepWindow, enable

    first = cases[0]
    target, draft = case_models(models_dir, first, device="cuda")
    kwargs = engine_kwargs(first, target, draft, max(c.batch_size for c in cases), kv_pool_tokens(cases))
    kwargs["nccl_port"] = rendezvous_port()
    version = running_version()
    source = enable(version, kwargs) if step_times else None
    known = server_arg_names()
    kwargs = fit_server_args(kwargs, known)[0] if known else kwargs
    engine = sglang.Engine(**kwargs)
    return engine, (lambda: StepWindow(engine, version, source)) if step_times else None


def main(
    spec_path: str, lifeline_fd: Optional[str] = None, runner_pid: Optional[str] = None, turns: Optional[str] = None
) -> int:
    """Start the engine, run ``plain_loop`` on every case of the spec, one line per case. Started by
    the runner (``lifeline_fd``, ``runner_pid``): it dies with the runner, as a worker does
    (``core.lifeline.hold``). ``turns``: ``READ_FD,WRITE_FD`` of a paired run (``core.turns``): every
    engine call in a turn taken with the probed worker."""
    from specwatch.core import lifeline
    from specwatch.core.protocol import BaselineLine, BaselineSpec
    from specwatch.core.turns import Turns, use

    if lifeline_fd is not None:
        lifeline.hold(None, int(lifeline_fd), int(runner_pid) if runner_pid else None)
    turned = use(Turns.parse(turns))
    from specwatch.worker.windows import RepeatPlan

    spec = BaselineSpec.model_validate_json(Path(spec_path).read_text())
    plan = RepeatPlan(spec.repeats, spec.min_timed_s, spec.ci_half_width, spec.max_repeats)
    engine, new_window = start_engine(spec.cases, spec.models_dir, spec.step_times)
    pinning = None
    if spec.pin_cores:
        from specwatch.worker.pinning import pin_cores

        pinning = pin_cores()
    try:
        with open(spec.results, "a") as out:
            for case in spec.cases:
                started = datetime.now(timezone.utc)
                try:
                    window = new_window() if new_window is not None else None
                    got = plain_loop(engine, case, spec.repeats, spec.flushed, plan, window)
                    line = BaselineLine(case_id=case.case_id, started_at=started, **got)
                except Exception as e:  # noqa: BLE001 - one case's loop: reported, the next case runs
                    line = BaselineLine(case_id=case.case_id, ok=False, reason=f"{type(e).__name__}: {e}"[:2000])
                line.finished_at = datetime.now(timezone.utc)
                line.core_pinning = pinning
                out.write(line.model_dump_json() + "\n")
                out.flush()
    finally:
        turned.last_unit(lambda: engine.shutdown())  # the probed worker times nothing while this engine goes down
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:5]))
