"""Named, reversible faults for the installed SGLang: each re-creates a bug class from SGLang's history.

A fault is a source edit applied at run time with SGLang's own source patcher
(``sglang.srt.debug_utils.source_patcher``: match text in a function, replace it, swap the
function's ``__code__``; ``PatchState.restore`` undoes it), or a property swap (``Fault.patch``)
where the patcher cannot reach. Nothing in site-packages is touched.

Where each edit goes moves between SGLang releases, so the edit itself is not kept here: the
release adapters (``rules.release_ranges``) hold one ``FaultSite`` per fault and release range, and
``rules.releases.fault_plan`` turns it into a ``FaultPlan`` for one release. In GPU runs the worker
hands the plan to the probe through ``PLAN_ENV`` and the probe applies it inside every SGLang
process once the target module is imported; in the CPU tier ``applied(plan)`` patches this
process. An edit whose matched text is gone fails loudly (``PatchApplicationError``) instead of
silently running clean.
"""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from dataclasses import dataclass
from enum import Enum
from typing import Callable, Iterator, Optional

from specwatch.inject.stalls import NULL_SLOWDOWNS, SLOW_VERIFY_GPU_US, SLOW_VERIFY_US

PLAN_ENV = "SPECWATCH_FAULT_PLAN"
"""Environment variable holding the active fault's plan (``FaultPlan.to_json``) for SGLang's processes."""


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


def hit_expression(name: str) -> str:
    """The statement (or term) an edit adds to count its own runs."""
    return f'__import__("specwatch.inject.faults", fromlist=["hit"]).hit("{name}")'


_hit = hit_expression


@dataclass(frozen=True)
class Fault:
    """One injectable fault: what it re-creates and what should catch it."""

    name: str
    """The fault's name (``--fault NAME``)."""
    recreates: str
    """The bug class it re-creates, in SGLang's terms."""
    sim_fault: Optional[SimFault] = None
    """The same bug in the CPU allocator simulation, where it has one."""
    expected_flag: str = ""
    """The metric or check expected to catch it."""
    patch: Optional[Callable[[], Callable[[], None]]] = None
    """For targets the source patcher cannot edit (properties): patch, return the undo. None for a
    source edit (its text comes from the release adapter)."""
    patch_modules: tuple[str, ...] = ()
    """Modules whose import triggers ``patch`` in SGLang's processes."""

    @property
    def edits_source(self) -> bool:
        """Whether the fault is a source-patcher edit (its site is per release)."""
        return self.patch is None


@dataclass(frozen=True)
class FaultEdit:
    """One edit of a fault in one module."""

    module: str
    """Module whose import triggers the edit in SGLang's processes."""
    patch_yaml: Optional[str] = None
    """The source patcher's configuration; None where ``Fault.patch`` does the work."""


@dataclass(frozen=True)
class FaultPlan:
    """One fault as one SGLang release needs it applied: one edit per module it reaches (EAGLE's and
    DFLASH's verify are different functions, each edited when its own module loads)."""

    name: str
    """The fault's name."""
    release: str
    """The SGLang version the plan was made for."""
    edits: tuple[FaultEdit, ...]
    """The fault's edits, one per module."""

    @property
    def modules(self) -> tuple[str, ...]:
        return tuple(e.module for e in self.edits)

    def to_json(self) -> str:
        return json.dumps(
            {"name": self.name, "release": self.release, "edits": [[e.module, e.patch_yaml] for e in self.edits]}
        )

    @classmethod
    def from_json(cls, text: str) -> "FaultPlan":
        d = json.loads(text)
        return cls(d["name"], d["release"], tuple(FaultEdit(m, y) for m, y in d["edits"]))


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
            sim_fault=SimFault.row_widen_revert,
            expected_flag="CPU: memory model disagrees with SGLang, simulation leaks; GPU: eagle_prepare_for_decode's "
            "row-width assertion (crash) at page>1 topk>1 near the context limit",
        ),
        Fault(
            name="unaligned-watermark",
            recreates="decode reservation not rounded up to whole pages (the ceil of the page-aligned decode "
            "watermark dropped: inline in eagle_prepare_for_decode, or in allocation_sizing."
            "page_aligned_decode_alloc_lens, shared by EAGLE and DFLASH)",
            sim_fault=SimFault.unaligned_watermark,
            expected_flag="leak check after flush (GPU); the CPU simulation's host allocator does not leak on it",
        ),
        Fault(
            name="draft-page-mismatch",
            recreates="draft KV pool paged by the server page while the DCP allocator pages in page*dcp (seed 004)",
            patch=_draft_pool_paged_by_server_page,
            patch_modules=("sglang.srt.mem_cache.kv_cache_configurator",),
            sim_fault=SimFault.draft_page_mismatch,
            expected_flag="probe check draft_pool_page_matches_allocator (GPU, dcp>1); CPU simulation: missing draft "
            "rows near full occupancy",
        ),
        Fault(
            name="no-prefix-tail-dup",
            recreates="prefix partial-tail page not copied into each draft branch (page>1, topk>1): the draft's "
            "expand pass reads stale KV",
            expected_flag="acceptance below the oracle's on the tiny-attn oracle (its draft reads the prefix tail "
            "through attention); invisible to the tiny oracle, whose attention output never "
            "reaches the logits (seen on the H200, 0.5.17)",
        ),
        Fault(
            name="accept-off-by-one",
            recreates="verify reports one token fewer than it accepted (off-by-one between the bonus token and "
            "accept_lens): the scheduler drops each step's last token from the output while the next "
            "draft starts after it",
            expected_flag="lossless check (output skips one chain token per verify step) and acceptance below the "
            "oracle's exact value",
        ),
        *(
            Fault(
                name=name,
                recreates=f"a decode slowdown: {micros} µs of host time added to every EAGLE verify step (a verify "
                "path that got slower: an extra sync, a host-side loop), outputs and acceptance unchanged",
                expected_flag="compare: step_time, decode_throughput and speedup regressed against the clean run "
                "when the added share of a step is above the detection floor; every exact check stays clean",
            )
            for name, micros in SLOW_VERIFY_US.items()
            if name not in NULL_SLOWDOWNS
        ),
        *(
            Fault(
                name=name,
                recreates="nothing: the slowdowns' edit of every EAGLE verify step with no time added (its runs "
                "counted), the A/A twin of a clean pass when the two are interleaved in one run",
                expected_flag="nothing: compare calls no change beyond the noise floor, every check stays clean; "
                "its pairs with the clean pass price that floor (specwatch noise)",
            )
            for name in NULL_SLOWDOWNS
        ),
        *(
            Fault(
                name=name,
                recreates=f"a decode slowdown on the GPU: {micros} µs of GPU time queued before every EAGLE verify "
                "step's kernels (a verify kernel that got slower, an extra launch on the step's stream), outputs "
                "and acceptance unchanged; unlike host time, SGLang's overlap scheduler cannot hide it",
                expected_flag="compare: step_time, decode_throughput and speedup regressed against the clean run "
                "when the added share of a step is above the detection floor; every exact check stays clean",
            )
            for name, micros in SLOW_VERIFY_GPU_US.items()
            if name not in NULL_SLOWDOWNS
        ),
    )
}


def get(name: str) -> Fault:
    try:
        return FAULTS[name]
    except KeyError:
        raise ValueError(f"unknown fault {name!r}; known: {', '.join(FAULTS)}") from None


def apply(plan: FaultPlan, module: Optional[str] = None) -> list[Callable[[], None]]:
    """Patch this process with the plan's edits (only those of ``module`` when given); returns the
    undo callables (call in reverse order to restore)."""
    from specwatch.core.sglang_host import _quiet_import

    fault = get(plan.name)
    undo = []
    for edit in plan.edits:
        if module is not None and edit.module != module:
            continue
        _quiet_import(edit.module)
        if fault.patch is not None:
            undo.append(fault.patch())
            continue
        _quiet_import("sglang.srt.debug_utils.source_patcher")
        from sglang.srt.debug_utils.source_patcher import apply_patches_from_config

        undo += [state.restore for state in apply_patches_from_config(edit.patch_yaml)]
    return undo


@contextlib.contextmanager
def applied(plan: FaultPlan, module: Optional[str] = None) -> Iterator[Fault]:
    """Context manager: the fault (its edits of ``module`` only, when given) is active inside,
    restored after."""
    undo = apply(plan, module)
    try:
        yield get(plan.name)
    finally:
        for u in reversed(undo):
            u()
