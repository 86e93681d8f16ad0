"""Analytic memory model of SGLang's spec-decode KV sizing (CPU tier).

Two implementations side by side:

(a) ``reference_sizing``: specwatch's own formulas, written from the definitions below;
(b) ``sglang_sizing``: the installed SGLang's own host-side functions
    (``sglang/srt/mem_cache/allocation_sizing.py``) and its ``ReqToTokenPool`` built on the
    ``meta`` device (shape and bytes without allocating).

Definitions (P = server page size, D = dcp size, k = topk, s = num_steps, n = num_draft_tokens,
C = model context length, R = max running requests):

* alloc_len_per_decode: KV slots one decode step needs per request.
  No speculation: 1. Chain (k = 1), page 1, or a draft without KV (NGRAM): max(s*k, n).
  Tree on paged KV (P > 1, k > 1): every branch duplicates the prefix's partial tail page
  (up to P-1 tokens) and appends s draft tokens, so it needs ceil((P-1+s)/P) pages;
  max(ceil((P-1+s)/P) * P * k, n).
* alloc_reserve_per_decode: 2 * alloc_len_per_decode (double buffer for the overlap lag).
* req_to_token_extra_context_len: row headroom past C. 4 + n; with speculation and P > 1 at
  least reserve + P - 1, because the decode watermark is rounded up to a whole page (from SGLang
  0.5.16 on; 0.5.13-0.5.15 rows stop at the reserve: ``ROW_PAGE_SLACK_SINCE``; 0.5.12 rows are
  4 + n whatever the reserve: ``ROW_RESERVE_SINCE``).
* req_to_token_row_width = C + extra; req_to_token_bytes = (R + 1) * row_width * 4 (int32,
  one padding row).
* allocator_page_size = P * D (DCP pages in virtual slots).
* reserved_tokens_at_admission: output slots SGLang reserves per request when it admits it
  (``compute_num_reserved_tokens``): max(k*s, n) for the EAGLE family, 0 otherwise.
* max_seq_len: the longest request SGLang admits, C - reserved for EAGLE (the tokenizer's
  input + reserved + max_new_tokens <= C check), C - 1 otherwise (``tp_worker.max_req_len``).
* aligned_alloc_len_at_context_limit: the largest row index the spec-decode watermark can
  reach, ceil((max_seq_len - 1 + reserve) / (P*D)) * (P*D): the last decode step of the longest
  request starts with at most max_seq_len - 1 committed tokens, and the watermark is rounded to
  the *allocator's* page (``eagle_prepare_for_decode``). ``row_fits_watermark`` says whether the
  row holds it (the seed PR's invariant). None without speculation.
* holey_branch_footprint_tokens: worst-case KV a tree step holds, k * ceil((P-1+s)/P) * P.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from enum import Enum
from types import SimpleNamespace
from typing import Optional

from specwatch.core.case import Algorithm
from specwatch.rules.sizing_changes import Change, has

INT32_BYTES = 4


class ModelAlgorithm(str, Enum):
    """The speculative algorithms the memory model knows (SGLang's ``--speculative-algorithm``):
    the suites' ``Algorithm`` values plus DFLASH, whose decode step reserves a verify block of
    ``block_size = speculative_num_draft_tokens`` twice over (``dflash_info_v2.prepare_for_decode``)."""

    EAGLE = "EAGLE"
    EAGLE3 = "EAGLE3"
    STANDALONE = "STANDALONE"
    NGRAM = "NGRAM"
    DFLASH = "DFLASH"

    @property
    def has_draft_kv(self) -> bool:
        """Whether the draft phase writes KV chains (SGLang: ``SpeculativeAlgorithm.has_draft_kv``)."""
        return self is not ModelAlgorithm.NGRAM


@dataclass(frozen=True)
class SizingInput:
    """One configuration of the memory model."""

    algorithm: Optional[ModelAlgorithm]
    """None: no speculation; a suite ``Algorithm`` is read as the ``ModelAlgorithm`` of its name."""
    page_size: int
    topk: int
    num_steps: int
    num_draft_tokens: int
    context_len: int
    max_running_requests: int
    dcp: int = 1

    def __post_init__(self):
        if self.algorithm is not None and not isinstance(self.algorithm, ModelAlgorithm):
            object.__setattr__(
                self,
                "algorithm",
                ModelAlgorithm(
                    Algorithm(self.algorithm).value if isinstance(self.algorithm, Algorithm) else self.algorithm
                ),
            )

    @classmethod
    def for_case(cls, case, context_len: int, max_running_requests: int) -> "SizingInput":
        """The sizing parameters of a ``specwatch.core.case.Case`` at a given context and request pool."""
        return cls(
            case.algorithm if case.algorithm.speculative else None,
            case.page_size,
            case.topk,
            case.num_steps,
            case.num_draft_tokens,
            context_len,
            max_running_requests,
            case.dcp,
        )


@dataclass(frozen=True)
class Sizing:
    """The model's outputs (token counts unless the name says bytes)."""

    alloc_len_per_decode: int
    alloc_reserve_per_decode: int
    req_to_token_extra_context_len: int
    req_to_token_row_width: int
    req_to_token_bytes: int
    reserved_tokens_at_admission: Optional[int]
    max_seq_len: Optional[int] = None
    allocator_page_size: Optional[int] = None
    aligned_alloc_len_at_context_limit: Optional[int] = None
    row_fits_watermark: Optional[bool] = None
    holey_branch_footprint_tokens: Optional[int] = None
    decode_watermark_reserve: Optional[int] = None
    """KV past the committed length the decode watermark reaches: the per-decode reserve for the
    EAGLE family, ``2 * block_size`` (block = num_draft_tokens) for DFLASH; None without speculation."""

    def as_dict(self) -> dict:
        return asdict(self)


COMPARED_FIELDS = (
    "alloc_len_per_decode",
    "alloc_reserve_per_decode",
    "req_to_token_extra_context_len",
    "req_to_token_row_width",
    "req_to_token_bytes",
    "reserved_tokens_at_admission",
)
"""Fields both implementations compute; the others are specwatch's only."""


def reserved_tokens(x: SizingInput) -> int:
    """Output slots reserved per request at admission (EAGLE family only)."""
    if x.algorithm in (ModelAlgorithm.EAGLE, ModelAlgorithm.EAGLE3):
        return max(x.topk * x.num_steps, x.num_draft_tokens)
    return 0


def max_seq_len(x: SizingInput) -> int:
    """Longest request (prompt + output) SGLang admits at context length C."""
    r = reserved_tokens(x)
    return x.context_len - r if r else x.context_len - 1


def pages_per_branch(page_size: int, num_steps: int) -> int:
    return math.ceil((page_size - 1 + num_steps) / page_size)


ROW_PAGE_SLACK_SINCE = (0, 5, 16)
"""First SGLang release whose paged spec-decode req_to_token row adds page_size - 1 slots past the
per-decode reserve. Measured on the H200 (tiny, 8192-token context, topk 8, 3 steps): 0.5.13-0.5.15
rows are 10240 (page 64) and 16384 (page 256) slots wide, 0.5.16-0.5.17 rows 10303 and 16639."""


ROW_RESERVE_SINCE = (0, 5, 13)
"""First SGLang release whose paged spec-decode req_to_token row makes room for the per-decode
reserve. 0.5.12 sizes every row C + 4 + num_draft_tokens (``model_runner_kv_cache_mixin.py``:
``extra_max_context_len = 4 + speculative_num_draft_tokens``, a "temporary fix"). Measured on the
H200 (tiny, context 8192, flashinfer, page 64, topk 4, 3 steps, 8 draft tokens): 8204 slots on
0.5.12, 9216 on 0.5.13-0.5.15; such a row cannot hold the decode watermark at the context limit."""


def release(version: Optional[str]) -> Optional[tuple[int, ...]]:
    """``"0.5.13"`` / ``"0.5.17.post1"`` / ``"0.5.15rc2"`` -> (0, 5, 13) / (0, 5, 17) / (0, 5, 15)
    (PEP 440's release segment); None for None or a string that is no version."""
    from packaging.version import InvalidVersion, Version

    try:
        return Version(version).release if version else None
    except InvalidVersion:
        return None


def _watermark(x: SizingInput, ver, reserve: int, longest: int) -> tuple[Optional[int], Optional[int]]:
    """(decode watermark reserve, the watermark at the context limit). EAGLE-family rounding is
    modelled aligned for every release; DFLASH's is aligned from ``Change.dflash_watermark_aligned``
    (0.5.14-0.5.18: ``max(cur, committed + 2 * block_size)`` inline, unrounded)."""
    if x.algorithm is None:
        return None, None
    alloc_page = x.page_size * x.dcp
    if x.algorithm is ModelAlgorithm.DFLASH:
        wm_reserve = 2 * x.num_draft_tokens
        if not has(Change.dflash_watermark_aligned, ver):
            return wm_reserve, longest - 1 + wm_reserve
    else:
        wm_reserve = reserve
    return wm_reserve, math.ceil((longest - 1 + wm_reserve) / alloc_page) * alloc_page


def reference_sizing(x: SizingInput, sglang_version: Optional[str] = None) -> Sizing:
    """specwatch's own formulas (module docstring), for ``sglang_version`` (None: the newest rules;
    ``rules.sizing_changes`` says which release changed what)."""
    ver = release(sglang_version)
    # the sizing functions' page: the server page, or from 0.5.19 the allocator's (page x dcp)
    sp = x.page_size * x.dcp if has(Change.sizing_on_allocator_page, ver) else x.page_size
    page_slack = sp - 1 if has(Change.row_page_slack, ver) else 0
    kv_exempt = not x.algorithm.has_draft_kv and has(Change.ngram_flat_alloc, ver) if x.algorithm else True
    tree = not kv_exempt and sp > 1 and x.topk > 1
    if x.algorithm is None:
        alloc = 1
    elif tree:
        alloc = max(pages_per_branch(sp, x.num_steps) * sp * x.topk, x.num_draft_tokens)
    else:
        alloc = max(x.num_steps * x.topk, x.num_draft_tokens)
    reserve = 2 * alloc
    extra = 4 + (x.num_draft_tokens if x.algorithm is not None else 0)
    widens = x.topk > 1 or has(Change.row_page_slack, ver)  # 0.5.13-0.5.15 widen tree rows only
    if x.algorithm is not None and sp > 1 and widens and has(Change.row_reserve, ver):
        extra = max(extra, reserve + page_slack)
    row = x.context_len + extra
    longest = max_seq_len(x)
    wm_reserve, watermark = _watermark(x, ver, reserve, longest)
    return Sizing(
        alloc_len_per_decode=alloc,
        alloc_reserve_per_decode=reserve,
        req_to_token_extra_context_len=extra,
        req_to_token_row_width=row,
        req_to_token_bytes=(x.max_running_requests + 1) * row * INT32_BYTES,
        reserved_tokens_at_admission=reserved_tokens(x),
        max_seq_len=longest,
        allocator_page_size=x.page_size * x.dcp,
        aligned_alloc_len_at_context_limit=watermark,
        row_fits_watermark=None if watermark is None else watermark <= row,
        holey_branch_footprint_tokens=x.topk * pages_per_branch(sp, x.num_steps) * sp if tree else None,
        decode_watermark_reserve=wm_reserve,
    )


def server_args_for(x: SizingInput) -> SimpleNamespace:
    """The ServerArgs fields SGLang's sizing functions read, as a duck-typed namespace."""
    return SimpleNamespace(
        speculative_algorithm=x.algorithm.value if x.algorithm else None,
        speculative_num_steps=x.num_steps if x.algorithm else None,
        speculative_eagle_topk=x.topk if x.algorithm else None,
        speculative_num_draft_tokens=x.num_draft_tokens if x.algorithm else None,
        max_speculative_num_draft_tokens=x.num_draft_tokens if x.algorithm else None,
        page_size=x.page_size,
        dcp_size=x.dcp,
        speculative_adaptive=False,
        context_len=x.context_len,
        max_running_requests=x.max_running_requests,
    )


def sglang_sizing(x: SizingInput, source=None) -> Sizing:
    """SGLang's own sizing functions and ``ReqToTokenPool``, run from ``source``'s files
    (``release_sizing.SglangSource``; default: the installed SGLang's). Raises ImportError when
    SGLang is absent. Fields a release computes inline (0.5.13-0.5.16's admission reserve) are
    None. Where this process has already imported the installed SGLang's sizing module, that
    module runs (``installed_sizing``), so a source edit applied to it (``inject.faults``) counts."""
    import sys

    from specwatch.rules.release_sizing import SglangSource

    if source is None and "sglang.srt.mem_cache.allocation_sizing" in sys.modules:
        # this process imported the installed SGLang (a fault's source edit may be in it): use it
        return installed_sizing(x)
    source = source or SglangSource.installed()
    if source is None:
        raise ImportError("sglang is not installed")
    return Sizing(**source.sizing(server_args_for(x)))


def installed_sizing(x: SizingInput) -> Sizing:
    """The same through the installed SGLang imported whole (its modules, a ``meta``-device pool):
    the cross-check that running definitions from their files computes what SGLang computes."""
    from specwatch.core.sglang_host import num_reserved_tokens_fn, req_to_token_pool_class, sizing_module

    sizing = sizing_module()
    args = server_args_for(x)
    extra = sizing.get_req_to_token_extra_context_len(args)
    pool = req_to_token_pool_class()(
        size=x.max_running_requests, max_context_len=x.context_len + extra, device="meta", enable_memory_saver=False
    )
    t = pool.req_to_token
    return Sizing(
        alloc_len_per_decode=int(sizing.get_alloc_len_per_decode(args)),
        alloc_reserve_per_decode=int(sizing.get_alloc_reserve_per_decode(args)),
        req_to_token_extra_context_len=int(extra),
        req_to_token_row_width=int(t.shape[1]),
        req_to_token_bytes=int(t.numel() * t.element_size()),
        reserved_tokens_at_admission=int(num_reserved_tokens_fn()(args)),
    )


@dataclass(frozen=True)
class Disagreement:
    """One field where specwatch's formula and SGLang's function differ."""

    field: str
    reference: object
    sglang: object


def compare(x: SizingInput, source=None) -> tuple[Sizing, Optional[Sizing], list[Disagreement]]:
    """Both implementations for ``source``'s release (default: the installed SGLang) and the
    per-field disagreements (none when SGLang is absent; a field the release does not compute is
    not compared)."""
    from specwatch.rules.release_sizing import SglangSource

    release_source = source or SglangSource.installed()
    if release_source is None:
        return reference_sizing(x), None, []
    ref = reference_sizing(x, release_source.version)
    sgl = sglang_sizing(x, source)
    diffs = [
        Disagreement(f, getattr(ref, f), getattr(sgl, f))
        for f in COMPARED_FIELDS
        if getattr(sgl, f) is not None and getattr(ref, f) != getattr(sgl, f)
    ]
    return ref, sgl, diffs


SIZING_FIELDS = tuple(f.name for f in fields(Sizing))
