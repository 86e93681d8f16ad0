"""Verdicts on SGLang's KV pools from the probe's facts: coverage of the allocator, page agreement, row width.

Used by the worker when it judges a case and by the results frame when it re-reads an older
record under today's rules: one definition for both.
"""

from __future__ import annotations

from specwatch.core.case import Case
from specwatch.core.protocol import metric
from specwatch.oracle.shapes import SHAPES
from specwatch.rules.memory_model import Sizing, SizingInput, reference_sizing


def pool_coverage(allocator: dict, pool: dict | None, virtual_slot_writes: bool = False) -> dict | None:
    """Does ``pool`` hold every slot the shared allocator can hand out (seed 004)?

    The allocator's pages are 1..num_pages, so its last page ends at ``size + page_size`` (virtual
    slots; with DCP the allocator is ``max_total * dcp`` slots paged ``page * dcp``). A pool is valid
    to ``size + page_size`` in its own slot space, which is the allocator's divided by
    ``scale = allocator.size / pool.size`` (DCP's sharded target pool: dcp; a replicated draft
    pool: 1). ``virtual_slot_writes``: the pool is written at the allocator's virtual slots although
    it is per rank (a target whose attention backend has no DCP code, ``writes_at_virtual_slots``),
    so its slot space is the allocator's (scale 1).
    ``missing_rows`` counts allocator slots past the pool's end, by that definition and, where the
    probe saw the buffer, by the buffer's real row count (``missing_buffer_rows``)."""
    if not pool or not pool.get("size") or pool.get("page_size") is None:
        return None
    structural = allocator["size"] // pool["size"]
    if structural < 1 or structural * pool["size"] != allocator["size"]:
        return {
            "scale": None,
            "reason": f"allocator size {allocator['size']} is not a multiple of pool size {pool['size']}",
        }
    scale = 1 if virtual_slot_writes else structural
    needed = -(-(allocator["size"] + allocator["page_size"]) // scale)
    valid = pool["size"] + pool["page_size"]
    out = {
        "scale": scale,
        "allocator_slot_end": needed,
        "pool_valid_end": valid,
        "pool_page_size": pool["page_size"],
        "allocator_page_in_pool_slots": allocator["page_size"] // scale,
        "missing_rows": max(0, needed - valid),
    }
    if virtual_slot_writes:
        out["writes"] = "at the allocator's virtual slots: the attention backend has no DCP code"
    if pool.get("rows") is not None:
        out["buffer_rows"] = pool["rows"]
        out["missing_buffer_rows"] = max(0, needed - pool["rows"])
    return out


def writes_at_virtual_slots(probe_facts: dict) -> bool:
    """Under DCP, whether the target's KV writes ignore the DCP rank: its attention backend's source
    never mentions DCP (the probe's ``target_attention_backend``), so each rank writes every token at
    the allocator's virtual slot into a pool of allocator size / dcp rows (SGLang 0.5.17's
    flashinfer and fa3 backends; seen on 2xH200 as store_kvcache's bounds assertion near full)."""
    backend = probe_facts.get("target_attention_backend") or {}
    return probe_facts.get("dcp_size", 1) > 1 and backend.get("mentions_dcp") is False


def pool_checks(sw: dict) -> tuple[dict, dict, dict]:
    """Whether each KV pool holds every slot the shared allocator hands out (seed 004), from the
    probe's facts ``sw``: (metrics, checks, coverage details per role). Structural, the same right
    after the engine starts as after a case, so a group that crashes before its first record still
    gets it (``ENGINE_FACTS_EVENT``: on 2xH200 every dcp-2 flashinfer near-full case crashed)."""
    metrics, checks, coverage = {}, {}, {}
    a, dp = sw.get("allocator"), sw.get("draft_kv_pool")
    if not a:
        return metrics, checks, coverage
    virtual = writes_at_virtual_slots(sw)
    for role, pool in (("target", sw.get("target_kv_pool")), ("draft", dp)):
        cov = pool_coverage(a, pool, virtual_slot_writes=role == "target" and virtual)
        if cov and cov.get("scale"):
            coverage[role] = cov
            metrics[f"{role}_pool_missing_rows"] = metric(
                cov["missing_rows"], "slots", exact=True, higher_is_better=False
            )
            checks[f"{role}_pool_covers_allocator"] = (
                cov["missing_rows"] == 0 and cov.get("missing_buffer_rows", 0) == 0
            )
    if "draft" in coverage:
        checks["draft_pool_page_matches_allocator"] = draft_page_matches(coverage["draft"])
    return metrics, checks, coverage


def draft_page_matches(draft_coverage: dict) -> bool:
    """Seed 004's page rule, from a draft pool's ``pool_coverage``: its page is the allocator's page
    in the pool's own slot space (a replicated draft pool under DCP: page x dcp)."""
    return draft_coverage["pool_page_size"] == draft_coverage["allocator_page_in_pool_slots"]


def radix_cache_tokens(probe_facts: dict) -> int:
    """Tokens SGLang's radix cache held when the probe read it (evictable + protected): not free, and
    not leaked either (SGLang's idle invariant: free + these == capacity)."""
    return sum(probe_facts.get(f"tree_cache_{k}_size") or 0 for k in ("evictable", "protected"))


def req_to_token_vs_model(
    case: Case, size: int, row_width: float, row_bytes: float, sglang_version: str | None
) -> tuple[SizingInput, Sizing, bool]:
    """The memory model beside a measured req_to_token pool of ``size`` request slots: the sizing
    inputs of the case's engine, the model's sizing for that SGLang release (the row rule moved at
    0.5.13 and 0.5.16), and whether the row's width and bytes are the model's."""
    ctx = case.own_model.context_len if case.own_model else SHAPES[case.model].max_position
    inputs = SizingInput.for_case(case, ctx, size)
    model = reference_sizing(inputs, sglang_version)
    return inputs, model, model.req_to_token_row_width == row_width and model.req_to_token_bytes == row_bytes
