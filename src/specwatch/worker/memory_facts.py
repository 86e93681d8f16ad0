"""After a case: the probe's facts read from SGLang's scheduler and judged (leaks, pools, occupancy,
req_to_token against the memory model and SGLang's own sizing)."""

from __future__ import annotations

from specwatch.core.case import Case
from specwatch.core.errors import SpecwatchInputError
from specwatch.rules.memory_model import sglang_sizing
from specwatch.rules.pools import pool_checks, radix_cache_tokens, req_to_token_vs_model
from specwatch.rules.release_model import WatermarkSite
from specwatch.rules.releases import adapter_for
from specwatch.worker.engine_args import server_facts
from specwatch.worker.measure import MetricSet, flush_cache


def memory_and_leaks(engine, case: Case) -> tuple[dict, dict, dict]:
    """After a case: flush, read the probe's facts and judge them (leaks, pools, occupancy, the
    memory model and SGLang's own sizing); returns (metrics, checks, details)."""
    ok_flush, flush_refusals = flush_cache(engine)
    facts = server_facts(engine)
    sw = facts["specwatch"]
    metrics, checks, coverage, sizing_details = MetricSet(), {}, {}, None
    if "allocator" in sw:
        coverage = _pool_facts(sw, metrics, checks)
        if sw.get("occupancy") and sw["occupancy"].get("batches"):
            _occupancy_metrics(sw["occupancy"], metrics)
            _watermark_check(case, sw["occupancy"], facts.get("version"), checks)
        if "fault_code_runs" in sw:
            # a fault run whose edited code never ran in this case could not have been caught
            metrics.put("fault_code_runs", sw["fault_code_runs"], "calls", exact=False, higher_is_better=None)
        warn = sw.get("leak_warnings") or {}
        if any(v is not None for v in warn.values()):
            # SGLang's own idle leak check (strict by default: a leak would have crashed the scheduler)
            checks["sglang_idle_check_clean"] = not any(warn.values())
        if sw.get("cuda"):
            metrics.put("peak_gpu_memory", sw["cuda"]["max_allocated"], "bytes", higher_is_better=False)
        sizing_details = _sizing_checks(case, sw["req_to_token"], facts.get("version"), metrics, checks)
    checks["flush_cache"] = ok_flush
    return (
        metrics,
        checks,
        {
            "probe": sw,
            "pool_coverage": coverage,
            "sglang_sizing": sizing_details,
            "engine_memory_usage": facts.get("memory_usage"),
            "leak_check_flush_refusals": flush_refusals,
        },
    )


def _pool_facts(sw: dict, metrics: MetricSet, checks: dict) -> dict:
    """Leaks of KV slots and req slots, the pools' sizes and their coverage of the allocator;
    returns the coverage (``rules.pools.pool_checks``)."""
    a, r = sw["allocator"], sw["req_to_token"]
    capacity_pages = a["num_pages"]
    free_pages = a["unique_free_pages"] if a["unique_free_pages"] is not None else a["free_pages"]
    # After a flush the cache holds nothing; if the flush was refused, what it holds is not a leak.
    leaked = (capacity_pages - free_pages) * a["page_size"] - radix_cache_tokens(sw)
    metrics.put("leaked_tokens", leaked, "tokens", exact=True, higher_is_better=False)
    metrics.put("leaked_req_slots", r["size"] - r["free_slots"], "slots", exact=True, higher_is_better=False)
    checks["no_kv_leak"] = leaked == 0
    checks["no_req_slot_leak"] = r["size"] == r["free_slots"]
    checks["no_double_free"] = a["unique_free_pages"] in (None, a["free_pages"])
    metrics.put("req_to_token_row_width", r["row_width"], "tokens", exact=True)
    metrics.put("req_to_token_bytes", r["bytes"], "bytes", exact=True, higher_is_better=False)
    metrics.put("allocator_page_size", a["page_size"], "tokens", exact=True)
    # token slots the allocator hands out: with DCP, max_total_tokens x dcp virtual slots, while
    # kv_pool_tokens below is the target pool of one rank
    metrics.put("allocator_tokens", a["size"], "tokens", exact=True)
    if sw.get("target_kv_pool"):
        tp = sw["target_kv_pool"]
        metrics.put("kv_pool_tokens", tp["size"], "tokens", exact=True)
        if tp.get("bytes"):
            metrics.put("kv_pool_bytes", tp["bytes"], "bytes", exact=True, higher_is_better=False)
    dp = sw.get("draft_kv_pool")
    if dp and dp.get("bytes"):
        metrics.put("draft_kv_pool_bytes", dp["bytes"], "bytes", exact=True, higher_is_better=False)
    pool_metrics, pool_verdicts, coverage = pool_checks(sw)
    metrics.update(pool_metrics)
    checks.update(pool_verdicts)
    return coverage


def _occupancy_metrics(occ: dict, metrics: MetricSet) -> None:
    """How full the KV pool ran during the case, per batch (the probe samples every batch)."""
    metrics.put("peak_token_usage", occ["peak"], "1", exact=False, higher_is_better=None)
    metrics.put("near_full_batch_share", occ["near_full"] / occ["batches"], "1")
    if occ.get("decode_batches"):
        # decode steps only (prefill chunks and the prefill-only batches run below it by design)
        metrics.put("near_full_decode_share", occ["decode_near_full"] / occ["decode_batches"], "1")
    if "probe_s" in occ:
        # what the probe's per-batch sample itself costs (timed inside the scheduler): the
        # harness-overhead bound that engine-to-engine noise cannot blur (specwatch overhead)
        metrics.put("probe_time_per_batch", occ["probe_s"] / occ["batches"] * 1e6, "us", higher_is_better=False)
    if "decode_unaligned_batches" in occ:
        # allocated but unrecorded KV slots after a decode step (seed 003: "unaligned tails leak at ps>1")
        metrics.put("decode_unrecorded_tail_max", occ["decode_unrecorded_tail_max"], "tokens", exact=True)
        metrics.put("decode_unaligned_batches", occ["decode_unaligned_batches"], "batches", exact=True)
    if "retracted_requests" in occ:
        # requests SGLang took out of a decode batch for lack of KV slots (each one then reruns)
        metrics.put("retracted_requests", occ["retracted_requests"], "requests", exact=True, higher_is_better=False)


def _watermark_check(case: Case, occ: dict, version, checks: dict) -> None:
    """``decode_watermark_page_aligned``: after every decode step, what the allocator handed the
    batch's requests is what they recorded (no partial last page beyond ``kv_allocated_len``).
    Judged at page > 1 for algorithms that draft into KV, on releases whose EAGLE decode watermark
    is rounded up to whole pages (the adapter's ``watermark`` site); on a release whose EAGLE
    watermark is itself unaligned (0.5.12-0.5.15) only the metrics are kept. DFLASH is judged by
    the same rule: its own watermark is rounded up only from 0.5.19 (the shared
    ``page_aligned_decode_alloc_lens``), so on 0.5.14-0.5.18 the check fails on DFLASH, which is
    the bug class seed 003 fixed (0.5.17 H200 records: every page-64/256 DFLASH case)."""
    if "decode_unaligned_batches" not in occ or case.page_size <= 1 or not case.algorithm.has_draft_kv:
        return
    try:
        site = adapter_for(str(version)).watermark
    except SpecwatchInputError:
        return
    if site is not WatermarkSite.inline_unaligned:
        checks["decode_watermark_page_aligned"] = occ["decode_unaligned_batches"] == 0


def _sizing_checks(case: Case, r: dict, version, metrics: MetricSet, checks: dict) -> dict:
    """The CPU-tier memory model next to the real req_to_token, and the running SGLang's own sizing
    functions on the same inputs: when a row width moves between versions, this says whether the
    sizing rule moved or something else did. Returns the sizing's details."""
    inputs, model, checks["req_to_token_matches_model"] = req_to_token_vs_model(
        case, r["size"], r["row_width"], r["bytes"], version
    )
    metrics.put("model_req_to_token_bytes", model.req_to_token_bytes, "bytes", exact=True)
    try:
        own = sglang_sizing(inputs)
    except Exception as e:  # an older SGLang without the sizing module
        return {"error": f"{type(e).__name__}: {e}"[:300]}
    metrics.put("sglang_alloc_len_per_decode", own.alloc_len_per_decode, "tokens", exact=True)
    checks["req_to_token_matches_sglang_sizing"] = own.req_to_token_row_width == r["row_width"]
    return own.as_dict()
