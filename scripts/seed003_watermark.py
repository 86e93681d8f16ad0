"""The unaligned decode watermark (seed 003) on a release's own allocator, with and without the round-up.

Drives an unpacked SGLang release (0.5.19 on: ``allocation_sizing.page_aligned_decode_alloc_lens``)
on the CPU, imported beside the installed SGLang by ``specwatch.rules.release_classes`` (its pool
and allocator built by ``specwatch.cpu.sim_pools``, as the allocator simulation builds them), the
way the scheduler does for spec-v2 decode:

1. prefill: a req_to_token row from ``ReqToTokenPool.alloc``, the prompt from the release's own
   ``PagedTokenToKVPoolAllocator.alloc_extend`` (its torch path: no Triton on the CPU);
2. each decode step: the release's own ``page_aligned_decode_alloc_lens`` (EAGLE's and DFLASH's
   watermark), then what ``allocation.alloc_for_spec_decode`` does with it: ``get_last_loc_torch``,
   ``alloc_extend(cur, nxt)``, the row written at ``[cur, nxt)`` (``assign_req_to_token_pool``),
   ``kv_allocated_len = max(kv_allocated_len, nxt)``; then a seeded number of tokens commits;
3. finish and retraction: what ``common.release_kv_cache`` does without a prefix cache: the
   release's ``BasePrefixCache.free_kv_row`` over ``[cache_protected_len, committed)``, then its
   ``_release_overallocated_kv_indices(committed, kv_allocated_len)``.

The faulted run applies specwatch's ``unaligned-watermark`` edit for that release
(``rules.releases.adapter_for(version).faults``) with the release's own source patcher, so the
helper that runs is the release's with the round-up removed.

Each run reports, per decode step, the pages the allocator has handed out and the page ids each
request's row holds, and at the end the pages missing from the free list (leak) and the pages in
it twice (double free); beside them what the two runs differ in: the tokens of the last page no
request records (``ceil_align(kv_allocated_len) - kv_allocated_len``), the decode steps that call
the allocator, and SGLang's own busy-time accounting (``pool_stats_observer.kv_private_tokens``,
which rounds ``kv_allocated_len`` up to a page) beside the same sum without the rounding.

    PYTHONPATH=src .venv/bin/python scripts/seed003_watermark.py [--root .cache/sglang-src/0.5.23]

prints one JSON object per configuration and variant and, last, the comparison.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_RELEASE = ROOT / ".cache" / "sglang-src" / "0.5.23"

CONFIGS = (
    # name, algorithm, page, topk, num_steps, num_draft_tokens
    ("eagle-chain-p16", "EAGLE", 16, 1, 3, 4),
    ("eagle-chain-p64", "EAGLE", 64, 1, 3, 4),
    ("eagle-tree-p16", "EAGLE", 16, 4, 3, 8),
    ("eagle-tree-p64", "EAGLE", 64, 8, 3, 16),
    ("dflash-p16", "DFLASH", 16, 1, 1, 16),
    ("dflash-p256", "DFLASH", 256, 1, 1, 16),
)


def apply_unaligned_fault(version: str):
    """specwatch's ``unaligned-watermark`` edit for ``version``, applied with the release's source
    patcher; returns the undo callables."""
    from sglang.srt.debug_utils.source_patcher import apply_patches_from_config

    from specwatch.rules.releases import adapter_for

    site = adapter_for(version).faults["unaligned-watermark"]
    indent = lambda text: "\n".join("          " + line for line in text.splitlines())  # noqa: E731
    yaml = (
        f"patches:\n  - target: {site.target}\n    edits:\n      - match: |\n{indent(site.match)}\n"
        f"        replacement: |\n{indent(site.replacement.format(hit='0'))}\n"
    )
    with contextlib.redirect_stdout(sys.stderr):  # the patcher reports each patch on stdout
        return [state.restore for state in apply_patches_from_config(yaml)]


def alloc_len_per_decode(algorithm: str, page: int, topk: int, steps: int, draft: int) -> int:
    """The release's ``get_alloc_len_per_decode`` with its runtime-context reads answered."""
    from sglang.srt.mem_cache import allocation_sizing as s

    spec = SimpleNamespace(speculative_algorithm=algorithm, speculative_num_steps=steps, speculative_eagle_topk=topk)
    saved = (s.get_spec, s.max_speculative_num_draft_tokens, s.get_alloc_page_size)
    s.get_spec, s.max_speculative_num_draft_tokens, s.get_alloc_page_size = (
        lambda: spec,
        lambda: draft,
        lambda: page,
    )
    try:
        return s.get_alloc_len_per_decode()
    finally:
        s.get_spec, s.max_speculative_num_draft_tokens, s.get_alloc_page_size = saved


class _Cache:
    """The two attributes ``BasePrefixCache.free_kv_row`` and ``_release_overallocated_kv_indices`` read."""

    def __init__(self, allocator, pool):
        self.token_to_kv_pool_allocator = allocator
        self.req_to_token_pool = pool

    def free_kv_row(self, kv, ranges):
        from sglang.srt.mem_cache.base_prefix_cache import BasePrefixCache

        BasePrefixCache.free_kv_row(self, kv, ranges)


class Engine:
    """One variant's allocator, row pool and requests, stepped like the scheduler's decode loop."""

    def __init__(self, classes, page: int, reserve: int, num_requests: int, max_context: int, pool_pages: int):
        from specwatch.cpu.sim_pools import make_allocator

        self.page, self.reserve = page, reserve
        # the release's allocator on its torch path (0.5.23) or its alloc_extend_naive (before)
        self.alloc = make_allocator(pool_pages * page, page, classes)
        self.pool = classes.req_to_token_pool(
            size=num_requests, max_context_len=max_context, device="cpu", enable_memory_saver=False
        )
        self.cache = _Cache(self.alloc, self.pool)
        self.start_free = self.alloc.available_size()
        self.stats = {"alloc_calls": 0, "decode_steps": 0, "max_unrecorded_tail": 0, "steps_with_tail": 0}
        self.stats.update(strict_accounting_mismatch_steps=0, sglang_accounting_mismatch_steps=0)
        self.trace: list[tuple] = []

    def admit(self, req) -> None:
        """Prefill: a row, then ``alloc_extend`` of ``[0, committed)`` written into it."""
        import torch

        self.pool.alloc([req])
        n = req.kv.kv_committed_len
        z = torch.tensor([0])
        out = self.alloc.alloc_extend(z, z, torch.tensor([n]), torch.tensor([n]), torch.tensor([-1]), n)
        self.pool.req_to_token[req.kv.req_pool_idx, :n] = out.to(torch.int32)
        req.kv.kv_allocated_len = n

    def prepare_decode(self, reqs) -> None:
        """The release's watermark helper, then ``alloc_for_spec_decode``'s allocation and row write."""
        import torch
        from sglang.srt.mem_cache.allocation import get_last_loc_torch
        from sglang.srt.mem_cache.allocation_sizing import page_aligned_decode_alloc_lens

        cur, nxt, need = page_aligned_decode_alloc_lens(reqs, reserve=self.reserve, page_size=self.page)
        if need > 0:
            self.stats["alloc_calls"] += 1
            idx = torch.tensor([r.kv.req_pool_idx for r in reqs])
            cur_t, nxt_t = torch.tensor(cur), torch.tensor(nxt)
            last = get_last_loc_torch(self.pool.req_to_token, idx, cur_t).to(torch.int64)
            out = self.alloc.alloc_extend(cur_t, cur_t, nxt_t, nxt_t, last, need)
            assert out is not None, "pool too small"
            at = 0
            for r, c, n in zip(reqs, cur, nxt):
                self.pool.req_to_token[r.kv.req_pool_idx, c:n] = out[at : at + n - c].to(torch.int32)
                at += n - c
        for r, n in zip(reqs, nxt):
            r.kv.kv_allocated_len = max(r.kv.kv_allocated_len, n)
        self._observe(reqs)

    def _observe(self, reqs) -> None:
        """Pages handed out, each row's page ids, and both accountings of the live rows."""
        from sglang.srt.managers.scheduler_components import pool_stats_observer
        from sglang.srt.utils.common import ceil_align

        # 0.5.23: pool_stats_observer.kv_private_tokens; 0.5.19: the same sum inline in
        # invariant_checker._get_total_uncached_sizes (ceil_align(kv_allocated_len) - protected)
        kv_private_tokens = getattr(
            pool_stats_observer,
            "kv_private_tokens",
            lambda kv, ps: ceil_align(kv.kv_allocated_len, ps) - kv.cache_protected_len,
        )

        self.stats["decode_steps"] += 1
        in_use = self.start_free - self.alloc.available_size()
        rows = tuple(
            tuple(
                sorted(set((self.pool.req_to_token[r.kv.req_pool_idx, : r.kv.kv_allocated_len] // self.page).tolist()))
            )
            for r in reqs
        )
        tail = sum(ceil_align(r.kv.kv_allocated_len, self.page) - r.kv.kv_allocated_len for r in reqs)
        self.stats["max_unrecorded_tail"] = max(self.stats["max_unrecorded_tail"], tail)
        self.stats["steps_with_tail"] += tail > 0
        sglang_view = sum(kv_private_tokens(r.kv, self.page) for r in reqs)
        strict_view = sum(r.kv.kv_allocated_len - r.kv.cache_protected_len for r in reqs)
        self.stats["sglang_accounting_mismatch_steps"] += sglang_view != in_use
        self.stats["strict_accounting_mismatch_steps"] += strict_view != in_use
        self.trace.append((in_use, rows))

    def release(self, req) -> None:
        """``release_kv_cache`` without a prefix cache (finish and retraction alike)."""
        from sglang.srt.mem_cache import common

        committed = req.kv.kv_committed_len
        self.cache.free_kv_row(req.kv, [(req.kv.cache_protected_len, committed)])
        common._release_overallocated_kv_indices(req, committed, req.kv.kv_allocated_len, self.cache)
        self.pool.free(req)
        req.kv.kv_allocated_len = 0

    def verdict(self) -> dict:
        """Pages missing from the free list and pages in it twice, after every request released."""
        import torch

        a = self.alloc
        free = (
            a.get_all_free_pages() if hasattr(a, "get_all_free_pages") else torch.cat((a.free_pages, a.release_pages))
        )
        unique = int(torch.unique(free).numel())
        out = dict(self.stats)
        out["leaked_pages"] = self.start_free // self.page - unique
        out["double_freed_pages"] = int(free.numel()) - unique
        out["peak_pages_in_use"] = max(t[0] for t in self.trace) // self.page
        return out


def run_variant(classes, cfg: tuple, seed: int = 0) -> tuple[dict, list]:
    """One configuration: 4 requests of unequal prompts, seeded acceptance, request 0 retracted at
    step 7 and admitted again, every request run to its output length."""
    from sglang.srt.managers.schedule_batch import ReqKvInfo

    _, algorithm, page, topk, steps, draft = cfg
    reserve = 2 * alloc_len_per_decode(algorithm, page, topk, steps, draft)
    prompts, output = (37, 100, 129, 250), 300
    longest = max(prompts) + output + reserve + page
    eng = Engine(classes, page, reserve, len(prompts), longest, pool_pages=len(prompts) * (longest // page + 2))
    reqs = [SimpleNamespace(rid=i, kv=ReqKvInfo(), target=p + output, finished_len=None) for i, p in enumerate(prompts)]
    for r, p in zip(reqs, prompts):
        r.kv.kv_committed_len = p
        eng.admit(r)
    rng, most = random.Random(seed), (steps + 1 if algorithm == "EAGLE" else draft)
    live, step = list(reqs), 0
    while live:
        eng.prepare_decode(live)
        step += 1
        for r in list(live):
            r.kv.kv_committed_len = min(r.kv.kv_committed_len + rng.randint(1, most), r.target)
            if r.kv.kv_committed_len >= r.target:
                eng.release(r)
                live.remove(r)
        if step == 7 and reqs[0] in live:
            eng.release(reqs[0])  # retraction: released without insert, prefilled again
            eng.admit(reqs[0])
    result = eng.verdict()
    result.update(reserve=reserve, page=page)
    return result, eng.trace


def _patch_runtime_reads() -> None:
    """``_release_overallocated_kv_indices`` asks the runtime context whether spec decoding is on."""
    from sglang.srt.mem_cache import common

    common.get_spec = lambda: SimpleNamespace(speculative_algorithm="EAGLE")
    common.get_serving = lambda: SimpleNamespace(strip_thinking_cache=False)


def compare(classes, names: tuple[str, ...] = ()) -> list[dict]:
    """Both variants of each configuration (``names``; all when empty), and whether their page
    traces are the same."""
    _patch_runtime_reads()
    rows = []
    for cfg in (c for c in CONFIGS if not names or c[0] in names):
        aligned, trace_a = run_variant(classes, cfg)
        undo = apply_unaligned_fault(classes.version)
        try:
            unaligned, trace_u = run_variant(classes, cfg)
        finally:
            for u in reversed(undo):
                u()
        rows.append(
            {
                "config": cfg[0],
                "aligned": aligned,
                "unaligned": unaligned,
                "same_pages_in_use_every_step": [t[0] for t in trace_a] == [t[0] for t in trace_u],
                "same_page_ids_every_step": trace_a == trace_u,
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=DEFAULT_RELEASE, help="an unpacked release (0.5.19 on)")
    parser.add_argument("--config", action="append", default=[], choices=[c[0] for c in CONFIGS])
    args = parser.parse_args()
    from specwatch.rules.release_classes import release_classes

    warnings.simplefilter("ignore")
    classes = release_classes(args.root.name, args.root)
    with classes.active():  # ``import sglang...`` below reads the release
        for row in compare(classes, tuple(args.config)):
            print(json.dumps(row))


if __name__ == "__main__":
    main()
