"""The long-prompt multi-turn workload: one batch per turn, each turn's prompt the previous turn's
prompt and answer plus new tokens, so the radix cache serves it."""

from __future__ import annotations

import statistics
import time

from specwatch.core.case import Case
from specwatch.oracle.predict import Oracle
from specwatch.oracle.prompts import OutputDigest, prompt_starts, timed_starts
from specwatch.oracle.shapes import SHAPES
from specwatch.worker.engine_args import greedy_sampling
from specwatch.worker.measure import (
    MetricSet,
    draft_oracle_for,
    expected_accept_length,
    matches_oracle,
    mismatched_tokens,
)


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
        turn = _conversation(engine, chains, case, sp, draft_oracle, digest)
        mismatches += turn["mismatches"]
        walls.append(turn["wall"])
        tps.append(turn["n_out"] / turn["wall"])
        als.append(statistics.mean(turn["als"]))
        if turn["expected_als"]:
            expected_als.append(statistics.mean(turn["expected_als"]))
        hit_shares.append(turn["cached"] / max(turn["later_prompt"], 1))
    med = statistics.median
    metrics = MetricSet()
    metrics.put("output_throughput", med(tps), "tokens/s", tps, higher_is_better=True)
    metrics.put("wall_time", med(walls), "s", walls, higher_is_better=False)
    metrics.put(
        "accept_length",
        med(als),
        "tokens/verify",
        als,
        expected=med(expected_als) if expected_als else None,
        exact=True,
        higher_is_better=True,
    )
    metrics.put("lossless_mismatches", mismatches, "tokens", exact=True, higher_is_better=False)
    # prompt tokens of turns 2.. served by the radix cache (the previous turn's prompt + answer)
    metrics.put("prefix_cache_hit_share", med(hit_shares), "1", hit_shares, higher_is_better=True)
    checks = {"lossless": mismatches == 0}
    if expected_als:
        checks["accept_length_matches_oracle"] = matches_oracle(als, expected_als)
    return {
        "metrics": metrics,
        "checks": checks,
        "details": {"output_digest": digest.hexdigest(), "turn_prompt_lens": lens},
    }


def _conversation(engine, chains: list[list[int]], case: Case, sp, draft_oracle, digest: OutputDigest) -> dict:
    """One timed conversation: every turn's batch in order; what it produced and what the radix
    cache served (prompt tokens of turns 2..)."""
    out = {"n_out": 0, "wall": 0.0, "als": [], "expected_als": [], "cached": 0, "later_prompt": 0, "mismatches": 0}
    for t, n in enumerate(case.prompt_lens()):
        t0 = time.perf_counter()
        outs = engine.generate(input_ids=[c[:n] for c in chains], sampling_params=sp)
        out["wall"] += time.perf_counter() - t0
        for o, c in zip(outs, chains):
            exp = c[n : n + case.output_len]
            digest.add(o["output_ids"])
            out["mismatches"] += mismatched_tokens(o["output_ids"], exp)
            out["n_out"] += len(o["output_ids"])
            m = o["meta_info"]
            out["als"].append(m.get("spec_accept_length", 0.0))
            if draft_oracle is not None:
                out["expected_als"].append(expected_accept_length(draft_oracle, case, exp))
            if t > 0:
                out["cached"] += m.get("cached_tokens", 0)
                out["later_prompt"] += n
    return out
