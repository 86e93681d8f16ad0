"""Which cases SGLang would refuse, and why: the reason is recorded, the case is never dropped.

Each rule quotes (or closely paraphrases) the check in SGLang 0.5.17 that it mirrors, so a
skipped case says what SGLang would have said. Rules are checked in order; the first that
applies gives the reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from specwatch.core.case import Algorithm, Case

PAGE_TREE_SPEC_BACKENDS = ("flashinfer", "fa3", "triton")
"""Backends with the two-pass cascade draft decode that topk>1 on paged KV needs
(``sglang/srt/arg_groups/speculative_hook.py``, ``_PAGE_TREE_SPEC_BACKENDS``)."""


H200_CHUNKED_PREFILL_SIZE = 8192
"""SGLang's chunked_prefill_size on a GPU of 90-160 GiB (H200) when none is given
(``server_args.py:_handle_gpu_memory_settings``); specwatch's engines leave it at that default
except near-full cases, which turn chunked prefill off (``worker.engine_args``)."""


@dataclass(frozen=True)
class Rule:
    """One validity rule: ``check(case)`` returns the skip reason, or None when the case is valid."""

    name: str
    source: str
    check: Callable[[Case], Optional[str]]


def _dcp_divides_tp(c: Case) -> Optional[str]:
    if c.tp % c.dcp:
        return f"dcp_size={c.dcp} must divide tp_size={c.tp}"
    return None


def _page_divides_prefill_chunk(c: Case) -> Optional[str]:
    from specwatch.core.case import Workload

    if c.workload is not Workload.near_full and H200_CHUNKED_PREFILL_SIZE % c.page_size:
        return (
            f"chunked_prefill_size must be divisible by page_size (chunked_prefill_size="
            f"{H200_CHUNKED_PREFILL_SIZE} on H200, page_size={c.page_size})"
        )
    return None


def _tree_on_paged_kv(c: Case) -> Optional[str]:
    backend = c.attention_backend.value
    if c.algorithm is not Algorithm.NGRAM and c.topk > 1 and c.page_size > 1 and backend not in PAGE_TREE_SPEC_BACKENDS:
        return (
            f"speculative_eagle_topk > 1 with page_size > 1 is only supported on "
            f"{PAGE_TREE_SPEC_BACKENDS}; got attention_backend={backend!r}"
        )
    return None


def _ngram_tree_on_paged_kv(c: Case) -> Optional[str]:
    if c.algorithm is Algorithm.NGRAM and c.topk > 1 and c.page_size > 1 and c.attention_backend.value != "flashinfer":
        return (
            f"speculative_eagle_topk({c.topk}) > 1 with page_size({c.page_size}) > 1 is unstable "
            "and produces incorrect results for paged attention backends. This combination is "
            "only supported for the 'flashinfer' backend."
        )
    return None


def _tree_holds_draft_tokens(c: Case) -> Optional[str]:
    if c.algorithm in (Algorithm.NGRAM, Algorithm.DFLASH):  # DFLASH: num_draft_tokens is the block size
        return None
    limit = c.num_steps * c.topk + 1
    if c.num_draft_tokens > limit:
        return f"num_draft_tokens={c.num_draft_tokens} exceeds the draft tree's size num_steps*topk+1={limit}"
    return None


def _fits_context(c: Case) -> Optional[str]:
    from specwatch.oracle.shapes import SHAPES
    from specwatch.rules.memory_model import SizingInput, reserved_tokens

    ctx = SHAPES[c.model].max_position
    reserved = reserved_tokens(SizingInput.for_case(c, ctx, 1))
    prompt = c.prompt_lens()[-1]  # multi-turn: the last turn's prompt is the longest
    total = prompt + reserved + c.output_len
    if prompt + reserved >= ctx:
        return f"The input ({prompt + reserved} tokens) is longer than the model's context length ({ctx} tokens)."
    if total > ctx:
        return (
            f"Requested token count exceeds the model's maximum context length of {ctx} tokens. You requested "
            f"a total of {total} tokens: {prompt + reserved} tokens from the input messages and "
            f"{c.output_len} tokens for the completion."
        )
    return None


def _mla_backend(c: Case) -> Optional[str]:
    from specwatch.oracle.shapes import SHAPES

    mla = SHAPES[c.model].arch == "deepseek-v3"
    if c.attention_backend.value == "flashmla" and not mla:
        return "attention_backend='flashmla' is an MLA backend; the model has no MLA attention"
    if c.attention_backend.value == "flashmla" and c.page_size != 64:
        return (
            "FlashMLA only supports a page_size of 64, change page_size to 64 (SGLang rewrites the case; "
            "the page-64 case covers it)"
        )
    if c.attention_backend.value == "flashinfer" and mla and c.topk > 1 and c.algorithm is not Algorithm.NGRAM:
        return "Currently Flashinfer MLA only supports topk=1 for speculative decoding"
    return None


def _eagle3_oracle(c: Case) -> Optional[str]:
    from specwatch.core.case import Profile

    if c.algorithm is Algorithm.EAGLE3 and c.profile is not Profile.perfect:
        return (
            "specwatch: the EAGLE3 oracle draft is built for profile 'perfect' only (its attention "
            "reads the token itself; the wrong-first-choice profiles are EAGLE's)"
        )
    return None


def _near_full_shape(c: Case) -> Optional[str]:
    from specwatch.core.case import NEAR_FULL_MAX_OUTPUT_SHARE, Workload

    share = c.output_len / (c.input_len + c.output_len)
    if c.workload is Workload.near_full and share > NEAR_FULL_MAX_OUTPUT_SHARE:
        return (
            f"specwatch: near-full holds token usage above 0.95 only when output_len is at most "
            f"{NEAR_FULL_MAX_OUTPUT_SHARE:.0%} of input_len + output_len (here {share:.0%}): usage climbs "
            f"from the prompts' share of the pool to full during decode"
        )
    return None


def _mla_oracle(c: Case) -> Optional[str]:
    from specwatch.core.case import Profile
    from specwatch.oracle.shapes import SHAPES

    if SHAPES[c.model].arch == "deepseek-v3" and (
        c.algorithm not in (Algorithm.EAGLE, Algorithm.NONE) or c.profile is not Profile.perfect
    ):  # NONE: a plain twin, the target alone
        return (
            "specwatch: the MLA oracle's draft is its MTP (NextN) layer, which predicts perfectly; "
            "only EAGLE with profile 'perfect' is built for it"
        )
    return None


DFLASH_ARG_REFUSALS: tuple[str, ...] = (
    "DFLASH speculative decoding only supports CUDA and NPU devices.",
    "Currently DFLASH speculative decoding does not support dp attention.",
    "Currently DFLASH speculative decoding only supports pp_size == 1.",
    "DFLASH speculative decoding requires setting --speculative-draft-model-path.",
    "--speculative-draft-window-size must be >= --speculative-num-draft-tokens (block_size).",
)
"""SGLang 0.5.17's argument refusals for DFLASH (``arg_groups/speculative_hook.py:_handle_dflash``,
the same words in 0.5.23) that no specwatch case can reach: specwatch runs on CUDA, never turns on
dp attention, pipeline parallelism or a draft window, and always passes the oracle draft's path."""


DFLASH_NUM_STEPS = "DFLASH only supports speculative_num_steps == 1; overriding speculative_num_steps={} to 1."
DFLASH_TOPK = "DFLASH only supports speculative_eagle_topk == 1; overriding speculative_eagle_topk={} to 1."
"""SGLang's warnings when it forces DFLASH's num_steps and topk to 1 (``_handle_dflash``)."""


def normalize_dflash(algorithm: Algorithm, topk: int, num_steps: int) -> tuple[int, int, tuple[str, ...]]:
    """(topk, num_steps, SGLang's words for each override): DFLASH runs with both forced to 1
    ("DFLASH does not use EAGLE-style `num_steps`/`topk`"); other algorithms keep theirs."""
    if algorithm is not Algorithm.DFLASH:
        return topk, num_steps, ()
    said = ((DFLASH_TOPK.format(topk),) if topk != 1 else ()) + (
        (DFLASH_NUM_STEPS.format(num_steps),) if num_steps != 1 else ()
    )
    return 1, 1, said


def _dflash_draft_heads(c: Case) -> Optional[str]:
    from specwatch.oracle.dflash import dflash_shape
    from specwatch.oracle.shapes import SHAPES

    if c.algorithm is not Algorithm.DFLASH or SHAPES[c.model].arch != "llama":
        return None
    d = dflash_shape(SHAPES[c.model])
    if d.heads % c.tp:
        return (
            f"DFlashAttention requires total_num_heads divisible by tp_size. total_num_heads={d.heads}, tp_size={c.tp}."
        )
    if d.kv_heads >= c.tp and d.kv_heads % c.tp or d.kv_heads < c.tp and c.tp % d.kv_heads:
        relation = (
            "total_num_kv_heads divisible by tp_size when >= tp_size"
            if d.kv_heads >= c.tp
            else ("tp_size divisible by total_num_kv_heads when total_num_kv_heads < tp_size")
        )
        return f"DFlashAttention requires {relation}. total_num_kv_heads={d.kv_heads}, tp_size={c.tp}."
    return None


def _dflash_oracle(c: Case) -> Optional[str]:
    from specwatch.core.case import Profile
    from specwatch.oracle.dflash import MAX_BLOCK, MIN_PROMPT

    if c.algorithm is not Algorithm.DFLASH:
        return None
    if c.profile is Profile.random:
        return "specwatch: the DFLASH oracle draft has no 'random' profile (its acceptance has no closed form)"
    if c.num_draft_tokens > MAX_BLOCK:
        return f"specwatch: the DFLASH oracle draft serves block sizes (num_draft_tokens) up to {MAX_BLOCK}"
    if c.input_len < MIN_PROMPT:
        return (
            f"specwatch: the DFLASH oracle draft is exact from {MIN_PROMPT} committed tokens on (its head "
            f"groups attend up to {MAX_BLOCK - 1} positions back); input_len={c.input_len}"
        )
    return None


def _serving_concurrency(c: Case) -> Optional[str]:
    from specwatch.core.case import Workload

    if c.workload is Workload.serving and c.batch_size > c.serving_requests:
        return (
            f"specwatch: the serving benchmark sends {c.serving_requests} requests (serving_prompts), so at most "
            f"that many are in flight; max-concurrency batch_size={c.batch_size} is never reached"
        )
    return None


def _scheduler_clips_output(c: Case) -> Optional[str]:
    from specwatch.oracle.shapes import SHAPES

    ctx = SHAPES[c.model].max_position
    prompt = c.prompt_lens()[-1]
    room = (ctx - 1) - prompt - 1
    if c.output_len > room:
        return (
            f"specwatch: SGLang would decode fewer than output_len={c.output_len} tokens: the scheduler clips "
            f"max_new_tokens to max_req_len - input_len - 1 = {room} (max_req_len = context_len - 1 = {ctx - 1})"
        )
    return None


RULES: tuple[Rule, ...] = (
    Rule(
        "mla-backend",
        "sglang/srt/arg_groups/overrides.py:_mla_backend_page_constraints; "
        "sglang/srt/layers/attention/flashinfer_mla_backend.py:FlashInferMLAMultiStepDraftBackend",
        _mla_backend,
    ),
    Rule("mla-oracle", "specwatch/oracle.py: write_deepseek_target", _mla_oracle),
    Rule("eagle3-oracle", "specwatch/oracle.py: write_eagle3_draft", _eagle3_oracle),
    Rule("dflash-oracle", "specwatch/oracle/dflash.py: write_dflash_draft", _dflash_oracle),
    Rule("dflash-draft-heads", "sglang/srt/models/dflash.py:DFlashAttention.__init__", _dflash_draft_heads),
    Rule("near-full-shape", "specwatch/engine_worker.py: kv_pool_tokens", _near_full_shape),
    Rule("page-divides-prefill-chunk", "sglang/srt/server_args.py:check_server_args", _page_divides_prefill_chunk),
    Rule("dcp-divides-tp", "sglang/srt/server_args.py (DCP groups split TP ranks)", _dcp_divides_tp),
    Rule("tree-on-paged-kv", "sglang/srt/arg_groups/speculative_hook.py:_handle_eagle", _tree_on_paged_kv),
    Rule("ngram-tree-on-paged-kv", "sglang/srt/arg_groups/speculative_hook.py:_handle_ngram", _ngram_tree_on_paged_kv),
    Rule("tree-holds-draft-tokens", "EAGLE tree: topk-wide, num_steps deep, plus the root", _tree_holds_draft_tokens),
    Rule(
        "fits-context",
        "sglang/srt/managers/tokenizer_manager.py:_validate_one_request (input counts "
        "compute_num_reserved_tokens: max(topk*steps, draft) for EAGLE)",
        _fits_context,
    ),
    Rule(
        "serving-concurrency", "sglang/benchmark/serving.py: --max-concurrency over --num-prompts", _serving_concurrency
    ),
    Rule(
        "scheduler-clips-output",
        "sglang/srt/managers/scheduler.py:init_req_max_new_tokens (max_req_len from tp_worker.py)",
        _scheduler_clips_output,
    ),
)


def normalize_draft_tokens(algorithm: Algorithm, topk: int, num_steps: int, num_draft_tokens: int) -> int:
    """SGLang rewrites num_draft_tokens to num_steps+1 when topk == 1 (EAGLE family); NGRAM's and
    DFLASH's (the block size) stay as given."""
    if algorithm not in (Algorithm.NGRAM, Algorithm.DFLASH) and topk == 1:
        return num_steps + 1
    return num_draft_tokens


def skip_reason(case: Case) -> Optional[str]:
    """Reason SGLang would refuse this case, or None."""
    for rule in RULES:
        reason = rule.check(case)
        if reason:
            return f"{rule.name}: {reason}"
    return None
