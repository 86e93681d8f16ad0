"""One ``ReleaseAdapter`` per range of SGLang releases, 0.5.12 to 0.5.23 (``ADAPTERS``).

Every value here was read from the release's own wheel (``scripts/fetch_sglang_sources.sh``
unpacks them; ``tests/test_releases.py`` imports each release's modules and checks every name,
signature and match text below against them).
"""

from __future__ import annotations

from specwatch.inject.stalls import SLOW_VERIFY, stall_statement
from specwatch.rules.release_model import (
    FaultSite,
    ReleaseAdapter,
    ServerArgsFields,
    SizingArgs,
    WatermarkSite,
)

_ARGS_OLD_NAMES = {
    "cuda_graph_max_bs_decode": "cuda_graph_max_bs",
    "disable_prefill_cuda_graph": "disable_piecewise_cuda_graph",
}
_ARG_FILES_OLD = ("srt/server_args.py",)
_ARG_FILES = ("srt/server_args.py", "srt/arg_groups/")


def _row_widen(target: str, match: str) -> FaultSite:
    """row-widen-revert: the condition that widens the row for paged spec decode made false."""
    return FaultSite(target=target, module=target.rsplit(".", 1)[0], match=match, replacement="{hit}\nif False:")


def _tail_dup(module: str) -> FaultSite:
    """no-prefix-tail-dup: the prefix tail copy returns before copying, for every topk."""
    return FaultSite(
        target=f"{module}.duplicate_prefix_tail_to_draft_branches",
        module=module,
        match="if topk <= 1:\n    return",
        replacement="{hit}\nreturn",
    )


def _off_by_one(target: str) -> FaultSite:
    """accept-off-by-one: accept_lens one short right before the next draft input is built."""
    return FaultSite(
        target=target,
        module=target.rsplit(".", 2)[0] if "EAGLEWorkerV2" in target else target.rsplit(".", 1)[0],
        match="next_draft_input = EagleDraftInput(bonus_tokens=bonus_tokens)",
        replacement="{hit}\naccept_lens = torch.clamp(accept_lens - 1, min=1)\n"
        "next_draft_input = EagleDraftInput(bonus_tokens=bonus_tokens)",
    )


def _slow_verify(target: str) -> dict[str, FaultSite]:
    """slow-verify-*: the fault's host spin or GPU sleep at the top of every EAGLE verify step."""
    module = target.rsplit(".", 2)[0] if "EAGLEWorkerV2" in target else target.rsplit(".", 1)[0]
    return {
        name: FaultSite(
            target=target,
            module=module,
            match="bs = len(batch.seq_lens)",
            replacement="{hit}\n" + stall_statement(name) + "\nbs = len(batch.seq_lens)",
        )
        for name in SLOW_VERIFY
    }


_S = "sglang.srt."
_DFLASH_V2 = "sglang.srt.speculative.dflash_worker_v2"


def _dflash_off_by_one() -> FaultSite:
    """accept-off-by-one on DFLASH's verify: commit_lens (its accept_lens) one short right before
    the next draft input is built (0.5.15 on: ``DFlashWorkerV2.forward_batch_generation``)."""
    return FaultSite(
        target=_DFLASH_V2 + ".DFlashWorkerV2.forward_batch_generation",
        module=_DFLASH_V2,
        match="next_draft_input = self._make_next_draft_input_decode(\nbonus_tokens=bonus,",
        replacement="{hit}\ncommit_lens = torch.clamp(commit_lens - 1, min=1)\n"
        "next_draft_input = self._make_next_draft_input_decode(\nbonus_tokens=bonus,",
    )


_UNALIGNED_INLINE = FaultSite(
    target=_S + "speculative.eagle_utils.eagle_prepare_for_decode",
    module=_S + "speculative.eagle_utils",
    match="(r.kv_committed_len + double_alloc + page_size - 1)\n// page_size\n* page_size,",
    replacement="r.kv_committed_len + double_alloc + 0 * {hit},",
)
_UNALIGNED_HELPER = FaultSite(
    target=_S + "mem_cache.allocation_sizing.page_aligned_decode_alloc_lens",
    module=_S + "mem_cache.allocation_sizing",
    match="(r.kv.kv_committed_len + reserve + page_size - 1) // page_size * page_size,",
    replacement="r.kv.kv_committed_len + reserve + 0 * {hit},",
)


def _common(**kw) -> dict:
    """Fields most ranges share; each range overrides what differs."""
    base = dict(
        correct_drafts_histogram_key="spec_correct_drafts_histogram",
        accept_histogram_key="spec_accept_histogram",
        req_to_token_pool_class=_S + "mem_cache.memory_pool.ReqToTokenPool",
        paged_allocator_module=_S + "mem_cache.allocator.paged",
        token_allocator_class=_S + "mem_cache.allocator.token.TokenToKVPoolAllocator",
        num_new_pages_fn=_S + "utils.common.get_num_new_pages",
        server_args_fields=ServerArgsFields.dataclass,
        renamed_args={},
        absent_args=frozenset(),
        arg_validation_files=_ARG_FILES,
        leak_counters_on="invariant_checker",
        scheduler_startup_time=True,
    )
    base.update(kw)
    return base


_NO_ROUND_UP = "the release's watermark is not rounded up to whole pages: the bug class is its own behaviour"
_SIZING_013 = _S + "mem_cache.common"
_SIZING = _S + "mem_cache.allocation_sizing"
_WORKER_V2_VERIFY = _S + "speculative.eagle_worker_v2.EAGLEWorkerV2.verify"
_RUN_EAGLE_VERIFY = _S + "speculative.eagle_worker_common.run_eagle_verify"
_PREPARE_V2 = _S + "speculative.eagle_info_v2.EagleDraftInputV2Mixin.prepare_for_decode"
_PREPARE = _S + "speculative.eagle_utils.eagle_prepare_for_decode"
_HELPER = _SIZING + ".page_aligned_decode_alloc_lens"
_HELPER_CALLERS = (_PREPARE, _S + "speculative.dflash_info_v2.DFlashDraftInputV2.prepare_for_decode")
_ROW_SA = "if server_args.speculative_algorithm is not None and server_args.page_size > 1:"
_ROW_SPEC = "if get_spec().speculative_algorithm is not None and page_size > 1:"
_ROW_UNO = "if page_size > 1 or spec_algo.is_uno():"
_ROW_013 = "server_args.speculative_algorithm is not None\nand server_args.page_size > 1"


def _sizing(
    module: str, sizing_args: SizingArgs, reserve: bool = True, page_fn: bool = False, reserved: bool = True
) -> dict:
    """The sizing fields of a range whose sizing functions live in ``module``."""
    return dict(
        sizing_module=module,
        alloc_len_fn=f"{module}.get_alloc_len_per_decode",
        alloc_reserve_fn=f"{module}.get_alloc_reserve_per_decode" if reserve else None,
        extra_context_len_fn=f"{module}.get_req_to_token_extra_context_len" if reserve else None,
        alloc_page_size_fn=f"{module}.get_alloc_page_size" if page_fn else None,
        sizing_args=sizing_args,
        reserved_tokens_fn=_S + "managers.utils.compute_num_reserved_tokens" if reserved else None,
        row_sizing_site="mem_cache/kv_cache_configurator.py:KVCacheConfigurator._build_req_to_token_pool"
        if module == _SIZING
        else "model_executor/model_runner_kv_cache_mixin.py:_init_pools",
    )


def _later_faults(row_match: str, unaligned: FaultSite) -> dict:
    """The fault edits of 0.5.16 on (eagle_worker_common holds the EAGLE worker's shared code)."""
    return dict(
        faults={
            "row-widen-revert": _row_widen(_SIZING + ".get_req_to_token_extra_context_len", row_match),
            "unaligned-watermark": unaligned,
            "no-prefix-tail-dup": _tail_dup(_S + "speculative.eagle_worker_common"),
            "accept-off-by-one": _off_by_one(_RUN_EAGLE_VERIFY),
            **_slow_verify(_RUN_EAGLE_VERIFY),
        },
        dflash_faults={"accept-off-by-one": _dflash_off_by_one()},
        faults_absent={},
    )


_KCC = _S + "mem_cache.kv_cache_configurator.KVCacheConfigurator"
_TREE_HOOK = "srt/arg_groups/speculative_hook.py:_handle_eagle_family"

ADAPTERS: tuple[ReleaseAdapter, ...] = (
    ReleaseAdapter(
        **_common(
            first="0.5.12",
            last="0.5.12",
            torch_pin="2.11.0",
            **_sizing(_S + "managers.utils", SizingArgs.server_args, reserve=False, reserved=False),
            watermark=WatermarkSite.inline_unaligned,
            watermark_function=_PREPARE_V2,
            watermark_callers=(_PREPARE_V2,),
            paged_allocator_module=_S + "mem_cache.allocator",
            token_allocator_class=_S + "mem_cache.allocator.TokenToKVPoolAllocator",
            kv_cache_configurator_class=None,
            draft_pool_page_size_property=False,
            renamed_args=_ARGS_OLD_NAMES,
            absent_args=frozenset({"dcp_size"}),
            arg_validation_files=_ARG_FILES_OLD,
            page_tree_spec_backends_site=None,
            leak_counters_on="scheduler",
            scheduler_startup_time=False,
            faults=_slow_verify(_WORKER_V2_VERIFY),
            faults_absent={
                "row-widen-revert": "rows are 4 + num_draft_tokens wide whatever the reserve "
                "(model_runner_kv_cache_mixin.py): the reverted sizing is the release's own",
                "unaligned-watermark": _NO_ROUND_UP,
                "no-prefix-tail-dup": "no duplicate_prefix_tail_to_draft_branches in this release",
                "accept-off-by-one": "EAGLEWorkerV2.verify builds new_seq_lens from accept_lens before the draft "
                "input: no line matches the edit",
            },
        )
    ),
    *(
        ReleaseAdapter(
            **_common(
                first=f"0.5.{x}",
                last=f"0.5.{x}",
                torch_pin="2.11.0",
                **_sizing(_SIZING_013, SizingArgs.server_args, reserved=False),
                watermark=WatermarkSite.inline_unaligned,
                watermark_function=_PREPARE if x == 15 else _PREPARE_V2,
                watermark_callers=(_PREPARE if x == 15 else _PREPARE_V2,),
                kv_cache_configurator_class=None,
                draft_pool_page_size_property=False,
                renamed_args=_ARGS_OLD_NAMES if x == 13 else {},
                absent_args=frozenset() if x == 15 else frozenset({"dcp_size"}),
                page_tree_spec_backends_site=_TREE_HOOK,
                scheduler_startup_time=False,
                faults={
                    "row-widen-revert": FaultSite(
                        target=_SIZING_013 + ".get_req_to_token_extra_context_len",
                        module=_SIZING_013,
                        match=_ROW_013,
                        replacement="{hit} != 0\nand server_args.page_size > 1",
                    ),
                    "no-prefix-tail-dup": _tail_dup(
                        _S + ("speculative.eagle_info_v2" if x == 13 else "speculative.base_spec_worker")
                    ),
                    "accept-off-by-one": _off_by_one(_WORKER_V2_VERIFY),
                    **_slow_verify(_WORKER_V2_VERIFY),
                },
                dflash_faults={"accept-off-by-one": _dflash_off_by_one()} if x == 15 else {},
                faults_absent={"unaligned-watermark": _NO_ROUND_UP},
            )
        )
        for x in (13, 14, 15)
    ),
    ReleaseAdapter(
        **_common(
            first="0.5.16",
            last="0.5.16",
            torch_pin="2.11.0",
            scheduler_startup_time=False,
            **_sizing(_SIZING, SizingArgs.server_args, reserved=False),
            watermark=WatermarkSite.inline_aligned,
            watermark_function=_PREPARE,
            watermark_callers=(_PREPARE,),
            kv_cache_configurator_class=_KCC,
            draft_pool_page_size_property=False,
            page_tree_spec_backends_site=_TREE_HOOK,
            **_later_faults(_ROW_SA, _UNALIGNED_INLINE),
        )
    ),
    ReleaseAdapter(
        **_common(
            first="0.5.17",
            last="0.5.17",
            torch_pin="2.11.0",
            **_sizing(_SIZING, SizingArgs.server_args),
            watermark=WatermarkSite.inline_aligned,
            watermark_function=_PREPARE,
            watermark_callers=(_PREPARE,),
            kv_cache_configurator_class=_KCC,
            draft_pool_page_size_property=True,
            page_tree_spec_backends_site=_TREE_HOOK,
            **_later_faults(_ROW_SA, _UNALIGNED_INLINE),
        )
    ),
    ReleaseAdapter(
        **_common(
            first="0.5.18",
            last="0.5.18",
            torch_pin="2.13.0",
            **_sizing(_SIZING, SizingArgs.runtime_context),
            watermark=WatermarkSite.inline_aligned,
            watermark_function=_PREPARE,
            watermark_callers=(_PREPARE,),
            kv_cache_configurator_class=_KCC,
            draft_pool_page_size_property=True,
            page_tree_spec_backends_site=_TREE_HOOK,
            **_later_faults(_ROW_SPEC, _UNALIGNED_INLINE),
        )
    ),
    ReleaseAdapter(
        **_common(
            first="0.5.19",
            last="0.5.19",
            torch_pin="2.13.0",
            **_sizing(_SIZING, SizingArgs.runtime_context, page_fn=True),
            watermark=WatermarkSite.page_aligned_helper,
            watermark_function=_HELPER,
            watermark_callers=_HELPER_CALLERS,
            kv_cache_configurator_class=_KCC,
            draft_pool_page_size_property=True,
            page_tree_spec_backends_site=_TREE_HOOK,
            **_later_faults(_ROW_SPEC, _UNALIGNED_HELPER),
        )
    ),
    *(
        ReleaseAdapter(
            **_common(
                first=first,
                last=last,
                torch_pin=torch,
                **_sizing(_SIZING, SizingArgs.runtime_context, page_fn=True),
                accept_histogram_key="spec_accept_histogram" if first == "0.5.20" else None,
                watermark=WatermarkSite.page_aligned_helper,
                watermark_function=_HELPER,
                watermark_callers=_HELPER_CALLERS,
                kv_cache_configurator_class=_KCC,
                draft_pool_page_size_property=True,
                server_args_fields=ServerArgsFields.signature,
                page_tree_spec_backends_site=_TREE_HOOK,
                **_later_faults(_ROW_UNO, _UNALIGNED_HELPER),
            )
        )
        for first, last, torch in (
            ("0.5.20", "0.5.20", "2.13.0"),
            ("0.5.21", "0.5.21", "2.13.0"),
            ("0.5.22", "0.5.23", "2.14.1"),
        )
    ),
)
