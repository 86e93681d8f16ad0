"""Sizing of the near-full workload: a KV pool small enough that the batch fills it, and the requests that do."""

from __future__ import annotations

import math

from specwatch.core.case import Case, ModelSize, Workload
from specwatch.oracle.shapes import SHAPES
from specwatch.rules.memory_model import SizingInput, reference_sizing

KV_TOKENS = {
    ModelSize.tiny: 1 << 18,
    ModelSize.tiny_attn: 1 << 18,
    ModelSize.tiny_mla: 1 << 18,
    ModelSize.llama_1b: 1 << 17,
    ModelSize.llama_8b: 1 << 16,
}
"""KV pool size per model for standard workloads (keeps start fast, memory numbers comparable
within a model, and several engines on one GPU under ``--parallel-starts``)."""


OWN_KV_TOKENS_MIN = 1 << 17
"""Smallest KV pool an own model's engine gets (``own_kv_tokens``), as llama_1b's standard pool."""


def own_kv_tokens(case: Case) -> int:
    """KV pool of an own model's engine: twice what its batch holds at its peak (prompt + output +
    one draft block per request), at least ``OWN_KV_TOKENS_MIN``. A pool sized from the memory
    fraction takes 70% of the GPU, so a second engine on that GPU (``--parallel-starts``) is refused
    by SGLang's "not enough memory" check before it loads."""
    peak = case.batch_size * (case.input_len + case.output_len + case.num_draft_tokens)
    return max(OWN_KV_TOKENS_MIN, 1 << (2 * peak - 1).bit_length())


MIN_DECODE_SHARE = 0.2
"""A repeat gets decode metrics only when wall - prefill is at least this share of its wall time."""


def near_full_request_tokens(case: Case) -> int:
    """KV slots one request of a near-full case holds at its peak, in whole allocator pages: prompt +
    max_new_tokens (SGLang admits a request only when both fit: with ``ignore_eos`` its new-token
    ratio is 1, ``schedule_policy.add_req_state``) + the per-decode reserve speculative decoding
    allocates ahead from the first decode step on (``alloc_reserve_per_decode``, specwatch's model;
    it exceeds what admission reserves, so the whole batch is admitted)."""
    reserve = reference_sizing(
        SizingInput.for_case(case, context_len=case.input_len + case.output_len, max_running_requests=case.batch_size)
    ).alloc_reserve_per_decode
    page = case.page_size * case.dcp
    return -(-(case.input_len + case.output_len + reserve) // page) * page


def near_full_extension(occupancy: dict, allocator_slots: int, case: Case) -> int:
    """Prompt tokens to add to (negative: take from) each request of a near-full batch, measured on
    its warm-up batch, so that the whole batch fits the pool with one allocator page per request to
    spare and no more: whole pages, within the model's context.

    The pool (``kv_pool_tokens``) comes from specwatch's model of SGLang's per-decode reserve. On the
    H200 (0.5.17, tiny, topk 8, 6144 -> 256, batch 16) the first peak was 0.9375 at page 64 and 256:
    15 requests decoded, each holding exactly the modelled peak, while the 16th waited (chunked
    prefill; ``engine_kwargs``). With whole-prompt prefill the warm-up filled the pool (1.000) and
    this took one page off each prompt (timed peak 0.98-0.99). The probe's decode peak and the
    requests running at it give the real per-request hold whatever the pool model says, so a model
    that is off moves the prompts, not the occupancy. A prompt token more is a KV slot more at every
    step; the spare page per request covers a last verify step that commits past ``output_len`` (up
    to num_steps tokens), and
    ``validity`` keeps output_len within 5% of the request, so usage stays above 0.95 from the first
    decode step on. Occupancy without a decode peak (older probes): the overall peak, whole batch."""
    page = case.page_size * case.dcp  # a prompt token is one allocator (virtual) slot
    usage = occupancy.get("decode_peak") or occupancy["peak"]
    running = occupancy.get("decode_peak_requests") or case.batch_size
    per_request = usage * allocator_slots / running
    spare = allocator_slots - case.batch_size * (per_request + page)
    pages = math.floor(spare / (case.batch_size * page))
    room = SHAPES[case.model].max_position - case.input_len - case.output_len  # the context still fits
    floor_pages = -(case.input_len // 2 // page)  # never below half the planned prompt
    return max(floor_pages, min(pages, room // page)) * page


def kv_pool_tokens(cases: list[Case]) -> int:
    """``max_total_tokens`` for an engine group: fixed per model, or sized to the batch (near-full);
    an own model's, its largest case's (``own_kv_tokens``).

    near-full: the largest batch's peak (``near_full_request_tokens`` per request), so SGLang admits
    the whole batch at once and its own reservations, not a queue, decide the occupancy. (The first
    design, 97% of prompts + a quarter of the outputs, let only three of four requests in: measured
    on 2xH200, peak usage 0.93-0.96 and 0-22% of batches above 0.95.) Whatever the reserve model
    gets wrong, ``run_case`` then resizes the prompts to the warm-up's measured decode peak
    (``near_full_extension``; on the H200 the model was exact and a chunked prefill had kept one
    request out, ``engine_kwargs``).
    Under DCP, SGLang takes ``max_total_tokens`` per rank and sizes its allocator to
    ``max_total_tokens * dcp`` virtual slots (0.5.17's kv_cache_configurator; seen on the x2 host:
    2^18 passed, an allocator of 2^19), so near-full asks for the need / dcp, in whole pages."""
    first = cases[0]
    if first.own_model is not None:
        return max(own_kv_tokens(c) for c in cases)
    if first.workload is not Workload.near_full:
        return KV_TOKENS[first.model]
    need = max(c.batch_size * near_full_request_tokens(c) for c in cases)
    return -(-need // (first.dcp * first.page_size)) * first.page_size
