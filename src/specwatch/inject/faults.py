"""Named, reversible faults for the installed SGLang: each re-creates a bug class from SGLang's history.

A fault is a set of source edits applied at run time with SGLang's own source patcher
(``sglang.srt.debug_utils.source_patcher``: match text in a function, replace it, swap the
function's ``__code__``; ``PatchState.restore`` undoes it). Nothing in site-packages is touched.
In GPU runs the probe applies the fault inside every SGLang process once the target module is
imported (``SPECWATCH_FAULT=NAME``); in the CPU tier ``applied(NAME)`` patches this process.

Edits are written against SGLang 0.5.17; a version where the matched text is gone fails loudly
(``PatchApplicationError``) instead of silently running clean.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import dataclass
from enum import Enum
from typing import Callable, Iterator, Optional


class SimFault(str, Enum):
    """Faults the simulation can plant (each re-creates a bug class from SGLang's history)."""

    row_widen_revert = "row-widen-revert"
    """req_to_token row headroom back to 4 + num_draft_tokens (the seed PR's bug, PR #26972)."""
    unaligned_watermark = "unaligned-watermark"
    """Decode watermark not rounded up to a whole allocator page."""
    draft_page_mismatch = "draft-page-mismatch"
    """Draft KV pool paged by the server page while the shared allocator pages in page*dcp
    (seed 004): the pool's rows end at size + page_size, the allocator's last page at
    size + page_size*dcp."""


HITS: Counter = Counter()
"""Times each fault's edited code ran in this process: every edit calls ``hit``. A fault run whose
edit never ran cannot have been caught, and its records say so (``fault_code_runs``: the engine's
total up to each case)."""


def hit(name: str) -> int:
    """Count one run of fault ``name``'s edited code; 0, so an expression can add it."""
    HITS[name] += 1
    return 0


def _hit(name: str) -> str:
    """The statement (or term) an edit adds to count its own runs."""
    return f'__import__("specwatch.inject.faults", fromlist=["hit"]).hit("{name}")'


@dataclass(frozen=True)
class Fault:
    """One injectable fault."""

    name: str
    recreates: str
    yaml: Optional[str]
    """SGLang source-patcher edits, or None when ``patch`` does the work."""
    modules: tuple[str, ...]
    """Modules whose import triggers the patch in SGLang's processes."""
    sim_fault: Optional[SimFault] = None
    """The same bug in the CPU allocator simulation, where it has one."""
    expected_flag: str = ""
    patch: Optional[Callable[[], Callable[[], None]]] = None
    """For targets the source patcher cannot edit (properties): patch, return the undo."""


def _draft_pool_paged_by_server_page() -> Callable[[], None]:
    from sglang.srt.mem_cache import kv_cache_configurator as kcc

    cls = kcc.KVCacheConfigurator
    original = cls.__dict__["pool_page_size"]
    cls.pool_page_size = property(lambda self: hit("draft-page-mismatch") + kcc.get_schedule().page_size)

    def undo() -> None:
        cls.pool_page_size = original

    return undo


FAULTS: dict[str, Fault] = {
    f.name: f
    for f in (
        Fault(
            name="row-widen-revert",
            recreates="req_to_token row headroom back to 4 + num_draft_tokens for page > 1 (PR #26972 reverted): "
            "the page-aligned tree reserve overruns the row, over-allocated slots are never freed",
            yaml="""
patches:
  - target: sglang.srt.mem_cache.allocation_sizing.get_req_to_token_extra_context_len
    edits:
      - match: |
          if server_args.speculative_algorithm is not None and server_args.page_size > 1:
        replacement: |
          """
            + _hit("row-widen-revert")
            + """
          if False:
""",
            modules=("sglang.srt.mem_cache.allocation_sizing",),
            sim_fault=SimFault.row_widen_revert,
            expected_flag="CPU: memory model disagrees with SGLang, simulation leaks; GPU: eagle_prepare_for_decode's "
            "row-width assertion (crash) at page>1 topk>1 near the context limit",
        ),
        Fault(
            name="unaligned-watermark",
            recreates="decode reservation not rounded up to whole pages (the ceil in eagle_prepare_for_decode dropped)",
            yaml="""
patches:
  - target: sglang.srt.speculative.eagle_utils.eagle_prepare_for_decode
    edits:
      - match: |
          (r.kv_committed_len + double_alloc + page_size - 1)
          // page_size
          * page_size,
        replacement: |
          r.kv_committed_len + double_alloc + 0 * """
            + _hit("unaligned-watermark")
            + """,
""",
            modules=("sglang.srt.speculative.eagle_utils",),
            sim_fault=SimFault.unaligned_watermark,
            expected_flag="leak check after flush (GPU); the CPU simulation's host allocator does not leak on it",
        ),
        Fault(
            name="draft-page-mismatch",
            recreates="draft KV pool paged by the server page while the DCP allocator pages in page*dcp (seed 004)",
            yaml=None,
            patch=_draft_pool_paged_by_server_page,
            modules=("sglang.srt.mem_cache.kv_cache_configurator",),
            sim_fault=SimFault.draft_page_mismatch,
            expected_flag="probe check draft_pool_page_matches_allocator (GPU, dcp>1); CPU simulation: missing draft "
            "rows near full occupancy",
        ),
        Fault(
            name="no-prefix-tail-dup",
            recreates="prefix partial-tail page not copied into each draft branch (page>1, topk>1): the draft's "
            "expand pass reads stale KV",
            yaml="""
patches:
  - target: sglang.srt.speculative.eagle_worker_common.duplicate_prefix_tail_to_draft_branches
    edits:
      - match: |
          if topk <= 1:
              return
        replacement: |
          """
            + _hit("no-prefix-tail-dup")
            + """
          return
""",
            modules=("sglang.srt.speculative.eagle_worker_common",),
            expected_flag="acceptance below the oracle's on the tiny-attn oracle (its draft reads the prefix tail "
            "through attention); invisible to the tiny oracle, whose attention output never "
            "reaches the logits (seen on the H200, 0.5.17)",
        ),
        Fault(
            name="accept-off-by-one",
            recreates="verify reports one token fewer than it accepted (off-by-one between the bonus token and "
            "accept_lens): the scheduler drops each step's last token from the output while the next "
            "draft starts after it",
            yaml="""
patches:
  - target: sglang.srt.speculative.eagle_worker_common.run_eagle_verify
    edits:
      - match: |
          next_draft_input = EagleDraftInput(bonus_tokens=bonus_tokens)
        replacement: |
          """
            + _hit("accept-off-by-one")
            + """
          accept_lens = torch.clamp(accept_lens - 1, min=1)
          next_draft_input = EagleDraftInput(bonus_tokens=bonus_tokens)
""",
            modules=("sglang.srt.speculative.eagle_worker_common",),
            expected_flag="lossless check (output skips one chain token per verify step) and acceptance below the "
            "oracle's exact value",
        ),
    )
}


def get(name: str) -> Fault:
    try:
        return FAULTS[name]
    except KeyError:
        raise ValueError(f"unknown fault {name!r}; known: {', '.join(FAULTS)}") from None


def apply(name: str) -> list[Callable[[], None]]:
    """Patch this process; returns the undo callables (call in reverse order to restore)."""
    from specwatch.core.sglang_host import _quiet_import

    fault = get(name)
    for mod in fault.modules:
        _quiet_import(mod)
    if fault.patch is not None:
        return [fault.patch()]
    _quiet_import("sglang.srt.debug_utils.source_patcher")
    from sglang.srt.debug_utils.source_patcher import apply_patches_from_config

    return [state.restore for state in apply_patches_from_config(fault.yaml)]


@contextlib.contextmanager
def applied(name: str) -> Iterator[Fault]:
    """Context manager: the fault is active inside, restored after."""
    undo = apply(name)
    try:
        yield get(name)
    finally:
        for u in reversed(undo):
            u()
