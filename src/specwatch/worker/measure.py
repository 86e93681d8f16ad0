"""Child process of the runner: one ``sglang.Engine`` serving every case of one engine group.

``python -m specwatch.worker SPEC.json``. Writes one JSON line per case to the spec's
``results`` file as soon as the case ends (the parent turns lines into records), plus an
``{"event": "engine_started"}`` line once the engine is up, so the parent can tell a crash at
start (the whole group fails alike) from a crash inside one case.

Per case: a warm-up batch (untimed), a prefill-only batch (``max_new_tokens=1``) to split
prefill from decode time, then ``repeats`` timed batches, each on fresh prompts (oracle chains
from seeded start tokens, so the radix cache never serves a timed prompt). After the case the
cache is flushed and the probe's facts are read from the scheduler: allocator and req slots must
be back to full (leak check).
"""

from __future__ import annotations

import os
import statistics
import time
from datetime import datetime, timezone

from specwatch.core.case import Algorithm, Case, Profile, Workload
from specwatch.core.protocol import metric
from specwatch.oracle.predict import NgramCorpusModel, Oracle
from specwatch.oracle.prompts import (
    OutputDigest,
    prompt_starts,
    timed_starts,
    timed_tag,
)
from specwatch.oracle.shapes import SHAPES
from specwatch.rules.memory_model import sglang_sizing
from specwatch.rules.pools import pool_checks, radix_cache_tokens, req_to_token_vs_model
from specwatch.worker.engine_args import greedy_sampling, server_facts
from specwatch.worker.near_full import MIN_DECODE_SHARE, near_full_extension


def now() -> str:
    return datetime.now(timezone.utc).isoformat()


def host_load() -> float | None:
    """The host's 1-minute load average: a timed case on a busy host (another engine compiling,
    leftover processes) is slower for reasons of its own; ``compare.aa_differences`` names it."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def draft_oracle_for(case: Case, oracle: Oracle) -> Oracle | None:
    """The oracle the draft follows, where its acceptance has a closed form: the case's own profile
    for EAGLE/EAGLE3, the perfect chain for STANDALONE; None for NGRAM and random drafts."""
    if case.profile is Profile.random or case.algorithm not in (Algorithm.EAGLE, Algorithm.EAGLE3,
                                                                Algorithm.STANDALONE):
        return None
    return oracle if case.algorithm is not Algorithm.STANDALONE else Oracle(oracle.shape, 0, Profile.perfect)


def expected_accept_length(draft_oracle: Oracle, case: Case, expected_output: list[int]) -> float:
    """Oracle acceptance length of one request whose greedy output is ``expected_output``."""
    return case.output_len / draft_oracle.expected_verifies(expected_output[0], case.output_len, case.num_steps,
                                                            case.topk, case.num_draft_tokens)


def mismatched_tokens(output_ids: list[int], expected: list[int]) -> int:
    """Output tokens that differ from the oracle chain, plus any length difference."""
    return sum(1 for a, b in zip(output_ids, expected) if a != b) + abs(len(output_ids) - len(expected))


def matches_oracle(measured: list[float], expected: list[float]) -> bool:
    """Every repeat's acceptance length equal to its oracle value (relative 1e-6: float noise only)."""
    return all(abs(m - e) <= 1e-6 * e for m, e in zip(measured, expected, strict=True))


def run_multi_turn(engine, case: Case, repeats: int, warmup: bool) -> dict:
    """Long-prompt multi-turn: each repeat is one batch per turn (``Case.prompt_lens``), sent in order,
    every prompt a prefix of the oracle chain that contains the previous turn's prompt and answer
    (so the radix cache serves it) plus new tokens. Outputs, acceptance and the share of prompt
    tokens the cache served are recorded per repeat; timing covers the whole conversation."""
    oracle = Oracle(SHAPES[case.model], 0, case.profile)
    sp = greedy_sampling(case)
    lens = case.prompt_lens()
    if warmup:
        starts = prompt_starts(case, "warmup", case.batch_size)
        engine.generate(input_ids=[oracle.chain(s, lens[0]) for s in starts], sampling_params=sp)
    tps, walls, als, expected_als, hit_shares = [], [], [], [], []
    mismatches, digest = 0, OutputDigest()
    draft_oracle = draft_oracle_for(case, oracle)
    for starts in timed_starts(case, repeats):
        chains = [oracle.chain(s, lens[-1] + case.output_len) for s in starts]
        n_out, wall, al_turns, exp_turns, cached, later_prompt = 0, 0.0, [], [], 0, 0
        for t, n in enumerate(lens):
            t0 = time.perf_counter()
            outs = engine.generate(input_ids=[c[:n] for c in chains], sampling_params=sp)
            wall += time.perf_counter() - t0
            for o, c in zip(outs, chains):
                exp = c[n:n + case.output_len]
                digest.add(o["output_ids"])
                mismatches += mismatched_tokens(o["output_ids"], exp)
                n_out += len(o["output_ids"])
                m = o["meta_info"]
                al_turns.append(m.get("spec_accept_length", 0.0))
                if draft_oracle is not None:
                    exp_turns.append(expected_accept_length(draft_oracle, case, exp))
                if t > 0:
                    cached += m.get("cached_tokens", 0)
                    later_prompt += n
        walls.append(wall)
        tps.append(n_out / wall)
        als.append(statistics.mean(al_turns))
        if exp_turns:
            expected_als.append(statistics.mean(exp_turns))
        hit_shares.append(cached / max(later_prompt, 1))
    med = statistics.median
    metrics = {
        "output_throughput": metric(med(tps), "tokens/s", tps, higher_is_better=True),
        "wall_time": metric(med(walls), "s", walls, higher_is_better=False),
        "accept_length": metric(med(als), "tokens/verify", als, expected=med(expected_als) if expected_als else None,
                                exact=True, higher_is_better=True),
        "lossless_mismatches": metric(mismatches, "tokens", exact=True, higher_is_better=False),
        # prompt tokens of turns 2.. served by the radix cache (the previous turn's prompt + answer)
        "prefix_cache_hit_share": metric(med(hit_shares), "1", hit_shares, higher_is_better=True),
    }
    checks = {"lossless": mismatches == 0}
    if expected_als:
        checks["accept_length_matches_oracle"] = matches_oracle(als, expected_als)
    return {"metrics": metrics, "checks": checks,
            "details": {"output_digest": digest.hexdigest(), "turn_prompt_lens": lens}}


NGRAM_ONE_PREFILL_TOKENS = 8192
"""Prompt tokens one prefill batch takes whole (SGLang's chunked_prefill_size for the tiny oracles on
the H200s, ``details.probe.scheduler_limits``): a larger NGRAM batch starts decoding in parts, which
``NgramCorpusModel`` does not model."""


FLUSH_WAIT_S = 5.0
"""How long ``flush_cache`` retries a flush SGLang refuses (seconds)."""


def flush_cache(engine, wait_s: float | None = None) -> tuple[bool, int]:
    """Flush SGLang's radix cache and pools; returns (flushed, refusals before the answer).

    ``Engine.flush_cache()`` returns a ``FlushCacheReqOutput`` (0.5.12-0.5.17), an object that is
    true whatever its ``success``; only ``success`` says whether the scheduler flushed. It refuses
    while it is not fully idle, and right after ``generate`` returns it can still hold the last
    batch (seen on the H200 under ``--overlap-starts``' host load: a 9984-token "leak" that was the
    radix cache). So a refusal is retried for ``wait_s``."""
    deadline = time.monotonic() + (FLUSH_WAIT_S if wait_s is None else wait_s)
    refusals = 0
    while True:
        out = engine.flush_cache()
        if bool(getattr(out, "success", out)):
            return True, refusals
        refusals += 1
        if time.monotonic() >= deadline:
            return False, refusals
        time.sleep(0.02)


def run_case(engine, case: Case, repeats: int, warmup: bool, calibrate: bool = False) -> dict:
    """One case's timed batches. ``calibrate`` (a probed near-full case): after the warm-up batch,
    resize every prompt by ``near_full_extension`` of the decode peak the probe measured on it."""
    oracle = Oracle(SHAPES[case.model], 0, case.profile)
    sp = greedy_sampling(case)
    input_len = case.input_len

    def batch(tag):
        """(prompts, expected outputs, the chain starts they come from)."""
        starts = prompt_starts(case, tag, case.batch_size)
        chains = [oracle.chain(s, input_len + case.output_len) for s in starts]
        return [c[:input_len] for c in chains], [c[input_len:] for c in chains], starts

    calibration = None
    if warmup:
        engine.generate(input_ids=batch("warmup")[0], sampling_params=sp)
        if calibrate and case.workload is Workload.near_full:
            sw = server_facts(engine)["specwatch"]      # reads (and resets) the warm-up's occupancy
            occ, alloc = sw.get("occupancy") or {}, sw.get("allocator") or {}
            if occ.get("batches") and alloc.get("size"):
                extension = near_full_extension(occ, alloc["size"], case)
                input_len += extension
                calibration = {"warmup_peak_token_usage": occ["peak"], "prompt_extension": extension,
                               "input_len": input_len, "warmup_occupancy": occ}

    tps, decode_tps, als, rates, step_ms, itl_ms, walls, mismatches, verify = [], [], [], [], [], [], [], 0, []
    prefills: list[float] = []
    digest = OutputDigest()
    draft_oracle = draft_oracle_for(case, oracle)
    # NGRAM: its corpus simulated (flushed before the timed batch, so it starts empty); only where
    # the batch decodes together from its prefill on: not near full, and prompts that one prefill
    # batch takes whole (SGLang's chunked_prefill_size on the H200s: 8192)
    ngram = NgramCorpusModel(oracle) if case.algorithm is Algorithm.NGRAM \
        and case.workload is Workload.standard and case.batch_size * case.input_len <= NGRAM_ONE_PREFILL_TOKENS \
        else None
    expected_per_repeat: list[float] = []
    timed: list[list[int]] = []          # each timed batch's chain starts
    hist = None
    flush_failures = flush_refusals = 0   # SGLang refuses a flush until idle: retried (flush_cache)

    def fresh_cache() -> None:
        nonlocal flush_failures, flush_refusals
        flushed, refused = flush_cache(engine)
        flush_failures, flush_refusals = flush_failures + (not flushed), flush_refusals + refused

    for r in range(repeats):
        # Nothing of an earlier batch stays in the radix cache: a timed prompt whose start an earlier
        # batch drew (the tiny-attn oracle has 256 starts) would skip its prefill, and the pairwise
        # decode split below assumes the prefill-only batch and the timed one both prefill in full.
        fresh_cache()
        # A prefill-only batch of the same shape right before each timed batch: decode time is
        # the timed batch's wall time minus it, pairwise, so one slow prefill spoils one repeat only.
        t = time.perf_counter()
        engine.generate(input_ids=batch(f"prefill{r}")[0], sampling_params={**sp, "max_new_tokens": 1})
        prefill_s = time.perf_counter() - t
        prefills.append(prefill_s)
        prompts, expected, starts = batch(timed_tag(r))
        timed.append(starts)
        fresh_cache()
        t = time.perf_counter()
        outs = engine.generate(input_ids=prompts, sampling_params=sp)
        wall = time.perf_counter() - t
        walls.append(wall)
        n_out = sum(len(o["output_ids"]) for o in outs)
        tps.append(n_out / wall)
        decode_s = wall - prefill_s
        if decode_s < MIN_DECODE_SHARE * wall:
            decode_s = None  # prefill-dominated or a noisy prefill sample: no decode split this repeat
        else:
            decode_tps.append(sum(len(o["output_ids"]) - 1 for o in outs) / decode_s)
        for o in outs:
            digest.add(o["output_ids"])
        for o, exp in zip(outs, expected):
            mismatches += mismatched_tokens(o["output_ids"], exp)
        metas = [o["meta_info"] for o in outs]
        als.append(statistics.mean(m.get("spec_accept_length", 0.0) for m in metas))
        rates.append(statistics.mean(m.get("spec_accept_rate", 0.0) for m in metas))
        vct = max(m.get("spec_verify_ct", 0) for m in metas)
        verify.append(vct)
        if decode_s is not None:
            step_ms.append(1e3 * decode_s / max(vct, 1))
            itl_ms.append(1e3 * decode_s / max(case.output_len - 1, 1))
        hist = metas[0].get("spec_accept_histogram", hist)
        if ngram is not None:
            ngram.flush()
            expected_per_repeat.append(statistics.mean(ngram.decode_batch(
                starts, input_len, case.output_len, case.num_draft_tokens)))
        if draft_oracle is not None:
            expected_per_repeat.append(statistics.mean(expected_accept_length(draft_oracle, case, exp)
                                                       for exp in expected))
    med = statistics.median
    expected_al = med(expected_per_repeat) if expected_per_repeat else None
    metrics = {
        "output_throughput": metric(med(tps), "tokens/s", tps, higher_is_better=True),
        "request_throughput": metric(med([case.batch_size / w for w in walls]), "requests/s",
                                     [case.batch_size / w for w in walls], higher_is_better=True),
        "wall_time": metric(med(walls), "s", walls, higher_is_better=False),
        "prefill_time": metric(med(prefills), "s", prefills, higher_is_better=False),
    }
    if decode_tps:
        metrics.update({
            "decode_throughput": metric(med(decode_tps), "tokens/s", decode_tps, higher_is_better=True),
            "step_time": metric(med(step_ms), "ms", step_ms, higher_is_better=False),
            "itl": metric(med(itl_ms), "ms", itl_ms, higher_is_better=False),
        })
    metrics.update({
        "accept_length": metric(med(als), "tokens/verify", als, expected=expected_al, exact=True,
                                higher_is_better=True),
        # SGLang's own: correct drafts / (verify steps x (num_draft_tokens - 1))
        "accept_rate": metric(med(rates), "1", rates, exact=True, higher_is_better=True),
        "verify_steps": metric(med(verify), "steps", verify, exact=True, higher_is_better=False),
        "lossless_mismatches": metric(mismatches, "tokens", exact=True, higher_is_better=False),
    })
    checks = {"lossless": mismatches == 0}
    if expected_per_repeat:
        # every repeat (its own prompts) against its own oracle value
        checks["accept_length_matches_oracle"] = matches_oracle(als, expected_per_repeat)
    return {"metrics": metrics, "checks": checks,
            "details": {"accept_histogram": hist, "prefill_s": prefills, "near_full_calibration": calibration,
                        "cache_flush_failures": flush_failures, "cache_flush_refusals": flush_refusals,
                        # identical prompts (seeded by dcp_twin_id) must give identical outputs
                        "output_digest": digest.hexdigest(),
                        # what the outputs answer: a twin's digest is comparable only with the same
                        "prompt_starts": timed,
                        "decode_split_repeats": len(decode_tps)}}


def memory_and_leaks(engine, case: Case) -> tuple[dict, dict, dict]:
    ok_flush, flush_refusals = flush_cache(engine)
    facts = server_facts(engine)
    sw = facts["specwatch"]
    metrics, checks, coverage, sizing_details = {}, {}, {}, None
    if "allocator" in sw:
        a, r = sw["allocator"], sw["req_to_token"]
        capacity_pages = a["num_pages"]
        free_pages = a["unique_free_pages"] if a["unique_free_pages"] is not None else a["free_pages"]
        # After a flush the cache holds nothing; if the flush was refused, what it holds is not a leak.
        leaked = (capacity_pages - free_pages) * a["page_size"] - radix_cache_tokens(sw)
        metrics["leaked_tokens"] = metric(leaked, "tokens", exact=True, higher_is_better=False)
        metrics["leaked_req_slots"] = metric(r["size"] - r["free_slots"], "slots", exact=True, higher_is_better=False)
        checks["no_kv_leak"] = leaked == 0
        checks["no_req_slot_leak"] = r["size"] == r["free_slots"]
        checks["no_double_free"] = a["unique_free_pages"] in (None, a["free_pages"])
        metrics["req_to_token_row_width"] = metric(r["row_width"], "tokens", exact=True)
        metrics["req_to_token_bytes"] = metric(r["bytes"], "bytes", exact=True, higher_is_better=False)
        metrics["allocator_page_size"] = metric(a["page_size"], "tokens", exact=True)
        # token slots the allocator hands out: with DCP, max_total_tokens x dcp virtual slots, while
        # kv_pool_tokens below is the target pool of one rank
        metrics["allocator_tokens"] = metric(a["size"], "tokens", exact=True)
        if sw.get("target_kv_pool"):
            tp = sw["target_kv_pool"]
            metrics["kv_pool_tokens"] = metric(tp["size"], "tokens", exact=True)
            if tp.get("bytes"):
                metrics["kv_pool_bytes"] = metric(tp["bytes"], "bytes", exact=True, higher_is_better=False)
        dp = sw.get("draft_kv_pool")
        if dp:
            if dp.get("bytes"):
                metrics["draft_kv_pool_bytes"] = metric(dp["bytes"], "bytes", exact=True, higher_is_better=False)
        pool_metrics, pool_verdicts, coverage = pool_checks(sw)
        metrics.update(pool_metrics)
        checks.update(pool_verdicts)
        occ = sw.get("occupancy")
        if occ and occ.get("batches"):
            metrics["peak_token_usage"] = metric(occ["peak"], "1", exact=False, higher_is_better=None)
            metrics["near_full_batch_share"] = metric(occ["near_full"] / occ["batches"], "1")
            if occ.get("decode_batches"):
                # decode steps only (prefill chunks and the prefill-only batches run below it by design)
                metrics["near_full_decode_share"] = metric(occ["decode_near_full"] / occ["decode_batches"], "1")
            if "probe_s" in occ:
                # what the probe's per-batch sample itself costs (timed inside the scheduler): the
                # harness-overhead bound that engine-to-engine noise cannot blur (specwatch overhead)
                metrics["probe_time_per_batch"] = metric(occ["probe_s"] / occ["batches"] * 1e6, "us",
                                                         higher_is_better=False)
            if "retracted_requests" in occ:
                # requests SGLang took out of a decode batch for lack of KV slots (each one then reruns)
                metrics["retracted_requests"] = metric(occ["retracted_requests"], "requests", exact=True,
                                                       higher_is_better=False)
        if "fault_code_runs" in sw:
            # a fault run whose edited code never ran in this case could not have been caught
            metrics["fault_code_runs"] = metric(sw["fault_code_runs"], "calls", exact=False, higher_is_better=None)
        warn = sw.get("leak_warnings") or {}
        if any(v is not None for v in warn.values()):
            # SGLang's own idle leak check (strict by default: a leak would have crashed the scheduler)
            checks["sglang_idle_check_clean"] = not any(warn.values())
        if sw.get("cuda"):
            metrics["peak_gpu_memory"] = metric(sw["cuda"]["max_allocated"], "bytes", higher_is_better=False)
        # The CPU-tier memory model next to the real objects
        inputs, model, checks["req_to_token_matches_model"] = req_to_token_vs_model(
            case, r["size"], r["row_width"], r["bytes"], facts.get("version"))
        metrics["model_req_to_token_bytes"] = metric(model.req_to_token_bytes, "bytes", exact=True)
        # ...and the running SGLang's own sizing functions on the same inputs: when a row width moves
        # between versions, this says whether the sizing rule moved or something else did
        try:
            own = sglang_sizing(inputs)
        except Exception as e:                       # an older SGLang without the sizing module
            sizing_details = {"error": f"{type(e).__name__}: {e}"[:300]}
        else:
            sizing_details = own.as_dict()
            metrics["sglang_alloc_len_per_decode"] = metric(own.alloc_len_per_decode, "tokens", exact=True)
            checks["req_to_token_matches_sglang_sizing"] = own.req_to_token_row_width == r["row_width"]
    checks["flush_cache"] = ok_flush
    return metrics, checks, {"probe": sw, "pool_coverage": coverage, "sglang_sizing": sizing_details,
                             "engine_memory_usage": facts.get("memory_usage"),
                             "leak_check_flush_refusals": flush_refusals}
