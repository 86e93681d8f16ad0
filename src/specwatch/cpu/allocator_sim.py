"""Allocator simulation (CPU tier): a release's real pools driven through spec-decode allocation.

The simulation builds one SGLang release's own ``ReqToTokenPool`` and token-to-KV allocator
(``PagedTokenToKVPoolAllocator``; ``TokenToKVPoolAllocator`` at page 1 without DCP) on the CPU
and replays what the scheduler does for each request:

1. prefill: take a req slot, ``alloc_extend`` the prompt, write its locations into the row;
2. decode steps (``eagle_prepare_for_decode`` + ``alloc_for_spec_decode``): raise the
   allocation watermark to ``ceil((committed + reserve) / page) * page``, ``alloc_extend`` the
   difference and write it into the row at ``[cur, nxt)``, then commit the accepted length
   (profile: always full = num_steps+1, always 1, or seeded random in between);
3. finish: free ``row[:kv_allocated_len]`` to the allocator and the slot to the pool.

Which release: the installed SGLang, or with ``SimConfig.release`` a release unpacked under
``.cache/sglang-src/<version>/`` (``rules.release_classes``): its classes, its sizing functions
(``rules.release_sizing``) and its version's rules (``rules.sizing_changes``). The result names the
classes that ran (``SimResult.sglang_classes``: version, origin, path).

Requests run to ``min(input_len + output_len, max_seq_len)``: the longest length SGLang admits
(``memory_model.max_seq_len``, which counts the EAGLE admission reserve).

Row writes mirror SGLang's ``assign_req_to_token_pool`` Triton kernel: the row is addressed as
``base + row * row_width + offset`` with no bound at the row's end, so an allocation past the
row lands in the next row (or past the tensor: counted as out of bounds). That is exactly how
the seed bug (row headroom ``4 + num_draft_tokens`` for page > 1, topk > 1) loses slots.

What runs on the CPU and what does not: up to 0.5.22 SGLang's ``alloc_extend`` always launches a
Triton kernel (``alloc_extend_kernel``) that needs a GPU. The simulation then calls the release's
own host implementation of the same computation, ``alloc_extend_naive`` (in the same module), and
the same bookkeeping ``alloc_extend`` does (``get_num_new_pages``, pop pages from
``free_pages``). From 0.5.23 ``alloc_extend`` itself has that torch path (``use_triton_kernels``
off) and runs unchanged. Everything else (``alloc``, ``free``, ``ReqToTokenPool``) is SGLang's code
unchanged.

After all requests finish, the allocator must hold every page again and the pool every slot:
the difference is the **leak**. Pages freed twice are reported separately.
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Optional

from specwatch.cpu.sim_pools import SimRequest, free_page_ids, make_allocator, sim_classes
from specwatch.inject.faults import SimFault
from specwatch.rules.memory_model import (
    ModelAlgorithm,
    SizingInput,
    max_seq_len,
    reference_sizing,
    release,
    sglang_sizing,
)
from specwatch.rules.sizing_changes import Change, has


class AcceptPattern(str, Enum):
    """How many tokens each verify step commits."""

    full = "full"
    """Always num_steps + 1 (perfect draft)."""
    one = "one"
    """Always 1 (draft always wrong)."""
    random = "random"
    """Seeded uniform in [1, num_steps + 1]."""


@dataclass(frozen=True)
class SimConfig:
    """One simulation run."""

    page_size: int
    topk: int
    num_steps: int
    num_draft_tokens: int
    context_len: int = 512
    num_requests: int = 4
    input_len: int = 300
    output_len: int = 10_000
    accept: AcceptPattern = AcceptPattern.full
    algorithm: ModelAlgorithm = ModelAlgorithm.EAGLE
    """A suite ``Algorithm`` reads as the ``ModelAlgorithm`` of its name."""
    dcp: int = 1
    seed: int = 0
    fault: Optional[SimFault] = None
    near_full: bool = False
    """Size the KV pool to the peak demand exactly, so the allocator's last page is handed out."""
    kv_write_ignores_dcp: bool = False
    """The target's attention backend writes each token's KV at the allocator's virtual slot into
    its per-rank pool (rows: allocator size / dcp + page), instead of sharding it. SGLang 0.5.17's
    flashinfer MHA backend has no DCP code (``dcp_kv_mask`` is set on HIP only); on 2xH200 at dcp 2
    its ``store_kvcache`` bounds assertion fired near full occupancy."""
    release: Optional[str] = None
    """Run this unpacked release's own pool and allocator classes (``rules.release_classes``), size
    rows and watermarks by its own sizing functions (``rules.release_sizing``) and its version's
    rules (DFLASH's watermark is page-aligned from 0.5.19); None: the installed SGLang."""

    def __post_init__(self):
        if not isinstance(self.algorithm, ModelAlgorithm):
            object.__setattr__(self, "algorithm", ModelAlgorithm(getattr(self.algorithm, "value", self.algorithm)))


@dataclass
class RowViolation:
    """A decode watermark past the end of the request's req_to_token row."""

    request: int
    committed_len: int
    watermark: int
    row_width: int


@dataclass
class SimResult:
    """What the simulation found."""

    config: dict
    sizing_source: str
    row_width: int
    reserve: int
    allocator_page_size: int
    pool_pages: int
    free_pages_after: int
    leaked_pages: int
    leaked_tokens: int
    double_freed_pages: int
    req_slots_leaked: int
    out_of_bounds_tokens: int
    decode_steps: int
    max_watermark: int
    draft_pool_page_size: int
    draft_pool_valid_rows: int
    missing_draft_rows: int
    """Allocated KV locations past the draft pool's last row (rows that do not exist)."""
    peak_token_usage: float
    target_pool_valid_rows: int = 0
    """Rows of one rank's target KV pool (allocator size / dcp + one page)."""
    missing_target_rows: int = 0
    """With ``kv_write_ignores_dcp``: distinct virtual slots handed out past the per-rank pool."""
    first_missing_target_usage: Optional[float] = None
    """Token usage right after the allocation that first handed out such a slot."""
    row_violations: list[RowViolation] = field(default_factory=list)
    request_rows: list[int] = field(default_factory=list)
    """The req_to_token row ``ReqToTokenPool.alloc`` gave each request, in admission order (a row
    overflow lands in the row after it, past the last row out of bounds)."""
    sglang_classes: dict = field(default_factory=dict)
    """The release whose classes ran: ``version``, ``origin`` (installed / cached), ``path`` (its
    ``sglang/`` folder) and ``alloc_extend`` (``release``: its own method; ``host-naive``: its
    ``alloc_extend_naive`` in place of the Triton launch)."""

    @property
    def clean(self) -> bool:
        return not (
            self.leaked_pages
            or self.double_freed_pages
            or self.req_slots_leaked
            or self.row_violations
            or self.out_of_bounds_tokens
            or self.missing_draft_rows
            or self.missing_target_rows
        )

    def as_dict(self) -> dict:
        d = asdict(self)
        d["clean"] = self.clean
        d["row_violations"] = len(self.row_violations)
        return d


def simulate(cfg: SimConfig, sizing_source: str = "sglang") -> SimResult:
    """Run the simulation on SGLang's classes; sizing from SGLang ("sglang") or specwatch ("reference").

    ``near_full``: a first pass with a roomy pool measures the peak demand; the second pass gets a
    pool of exactly that many pages, so the allocator hands out its last page at the peak (where
    seed 004's draft-pool fault shows)."""
    if not cfg.near_full:
        return _run(cfg, sizing_source, None)
    roomy = _run(cfg, sizing_source, None)
    peak_tokens = round(roomy.peak_token_usage * roomy.pool_pages) * roomy.allocator_page_size
    return _run(cfg, sizing_source, peak_tokens)


def _run(cfg: SimConfig, sizing_source: str, pool_tokens: Optional[int]) -> SimResult:
    classes = sim_classes(cfg.release)
    with classes.active():
        sim = _Simulation(cfg, sizing_source, pool_tokens, classes)
        reqs = [SimRequest(i) for i in range(cfg.num_requests)]
        for r in reqs:
            sim.prefill(r)
        active = list(reqs)
        while active:
            for r in list(active):
                if sim.decode_step(r):
                    active.remove(r)
        return sim.result()


def _sizing_input(cfg: SimConfig) -> SizingInput:
    return SizingInput(
        cfg.algorithm,
        cfg.page_size,
        cfg.topk,
        cfg.num_steps,
        cfg.num_draft_tokens,
        cfg.context_len,
        cfg.num_requests,
        cfg.dcp,
    )


class _Simulation:
    """One pass: SGLang's pool and allocator, and what the scheduler does to them per request."""

    def __init__(self, cfg: SimConfig, sizing_source: str, pool_tokens: Optional[int], classes):
        from specwatch.rules.release_sizing import SglangSource

        self.cfg, self.sizing_source, self.classes = cfg, sizing_source, classes
        x = _sizing_input(cfg)
        self.longest = max_seq_len(x)  # requests run to the longest length SGLang admits
        # the sizing functions of the release whose classes run (None: the installed SGLang's)
        source = SglangSource.cached(classes.version) if cfg.release else None
        sizing = sglang_sizing(x, source) if sizing_source == "sglang" else reference_sizing(x, cfg.release)
        model = reference_sizing(x, classes.version)
        # the watermark's reserve: the sizing's (EAGLE family) or 2 * block_size (DFLASH)
        self.reserve = (
            model.decode_watermark_reserve
            if cfg.algorithm is ModelAlgorithm.DFLASH
            else sizing.alloc_reserve_per_decode
        )
        version = release(classes.version)
        self.aligned = cfg.fault is not SimFault.unaligned_watermark and (
            cfg.algorithm is not ModelAlgorithm.DFLASH or has(Change.dflash_watermark_aligned, version)
        )
        extra = sizing.req_to_token_extra_context_len
        if cfg.fault is SimFault.row_widen_revert:
            extra = 4 + cfg.num_draft_tokens
        self.row_width = cfg.context_len + extra
        self.alloc_page = alloc_page = cfg.page_size * cfg.dcp
        # The draft pool is replicated over the allocator's virtual slots; 0.5.17 pages it like the
        # allocator (kv_cache_configurator.pool_page_size = page_size * dcp for a draft worker).
        self.draft_page = cfg.page_size if cfg.fault is SimFault.draft_page_mismatch else alloc_page
        if pool_tokens is None:
            per_req = math.ceil((self.row_width + self.reserve + alloc_page) / alloc_page) * alloc_page
            pool_tokens = per_req * cfg.num_requests
        self.allocator = make_allocator(pool_tokens, alloc_page, classes)
        self.draft_valid_rows = self.allocator.size + self.draft_page  # pools hold size + one padding page
        self.target_valid_rows = self.allocator.size // cfg.dcp + cfg.page_size  # one rank's pool
        self.missing: set[int] = set()
        self.missing_target: set[int] = set()
        self.first_missing_target_usage: Optional[float] = None
        self.peak_used = self.oob = self.max_watermark = self.steps = 0
        self.pool = classes.req_to_token_pool(
            size=cfg.num_requests, max_context_len=self.row_width, device="cpu", enable_memory_saver=False
        )
        self.flat = self.pool.req_to_token.view(-1)
        self.pages_total = self.allocator.available_size() // alloc_page
        self.rng = random.Random(cfg.seed)
        self.violations: list[RowViolation] = []
        self.request_rows: list[int] = []

    def write_row(self, req: SimRequest, start: int, values) -> None:
        """``assign_req_to_token_pool``: no bound at the row's end (see module doc)."""
        import torch

        lo = req.req_pool_idx * self.row_width + start
        hi = lo + len(values)
        fits = max(0, min(hi, self.flat.numel()) - lo)
        self.flat[lo : lo + fits] = values[:fits].to(torch.int32)
        self.oob += len(values) - fits

    def extend(self, req: SimRequest, cur: int, nxt: int):
        import torch

        if self.alloc_page == 1:
            out = self.allocator.alloc(nxt - cur)
        else:
            # ``get_last_loc``'s kernel reads the row like ``write_row`` writes it: no bound at the
            # row's end (past the tensor, where nothing was stored: -1, as for an empty row)
            at = req.req_pool_idx * self.row_width + cur - 1
            last = self.flat[at : at + 1].to(torch.int64) if 0 < cur and at < self.flat.numel() else None
            last = torch.tensor([-1]) if last is None else last
            t = lambda v: torch.tensor([v])  # noqa: E731
            out = self.allocator.alloc_extend(t(cur), t(cur), t(nxt), t(nxt), last, nxt - cur)
        if out is None:
            raise RuntimeError(f"simulated KV pool out of memory at {nxt - cur} tokens")
        self.missing.update(int(v) for v in out[out >= self.draft_valid_rows])
        if self.cfg.kv_write_ignores_dcp and self.cfg.dcp > 1:
            past = out[out >= self.target_valid_rows]
            if len(past) and self.first_missing_target_usage is None:
                total = self.pages_total * self.alloc_page
                self.first_missing_target_usage = 1 - self.allocator.available_size() / total
            self.missing_target.update(int(v) for v in past)
        return out

    def prefill(self, r: SimRequest) -> None:
        self.pool.alloc([r])
        self.request_rows.append(r.req_pool_idx)
        r.target_len = min(self.cfg.input_len + self.cfg.output_len, self.longest)
        self.write_row(r, 0, self.extend(r, 0, self.cfg.input_len))
        r.kv_allocated_len = r.kv_committed_len = self.cfg.input_len

    def accepted(self) -> int:
        """Tokens one verify step commits: up to num_steps + 1 (EAGLE family) or block_size (DFLASH)."""
        most = self.cfg.num_draft_tokens if self.cfg.algorithm is ModelAlgorithm.DFLASH else self.cfg.num_steps + 1
        if self.cfg.accept is AcceptPattern.full:
            return most
        return 1 if self.cfg.accept is AcceptPattern.one else self.rng.randint(1, most)

    def decode_step(self, r: SimRequest) -> bool:
        """Raise the watermark, allocate, commit; free the request when it is done (True then)."""
        import torch

        cur, want = r.kv_allocated_len, r.kv_committed_len + self.reserve
        if self.aligned:
            want = math.ceil(want / self.alloc_page) * self.alloc_page
        nxt = max(cur, want)
        if nxt > self.row_width:
            self.violations.append(RowViolation(r.idx, r.kv_committed_len, nxt, self.row_width))
        self.max_watermark = max(self.max_watermark, nxt)
        if nxt > cur:
            self.write_row(r, cur, self.extend(r, cur, nxt))
            r.kv_allocated_len = nxt
            self.peak_used = max(self.peak_used, self.pages_total * self.alloc_page - self.allocator.available_size())
        self.steps += 1
        r.kv_committed_len = min(r.kv_committed_len + self.accepted(), r.target_len)
        if r.kv_committed_len < r.target_len:
            return False
        # SGLang frees the row's allocated prefix (committed KV + over-allocation).
        row = self.pool.req_to_token[r.req_pool_idx, : min(r.kv_allocated_len, self.row_width)]
        self.allocator.free(row.to(torch.int64))
        self.pool.free(r)
        return True

    def result(self) -> SimResult:
        import torch

        cfg, a = self.cfg, self.allocator
        free_ids = free_page_ids(a)
        unique_free = len(torch.unique(free_ids))
        leaked_pages = self.pages_total - unique_free
        return SimResult(
            config={k: (v.value if isinstance(v, Enum) else v) for k, v in asdict(cfg).items()},
            sizing_source=self.sizing_source,
            row_width=self.row_width,
            reserve=self.reserve,
            allocator_page_size=self.alloc_page,
            pool_pages=self.pages_total,
            free_pages_after=unique_free,
            leaked_pages=leaked_pages,
            leaked_tokens=leaked_pages * self.alloc_page,
            double_freed_pages=len(free_ids) - unique_free,
            req_slots_leaked=cfg.num_requests - self.pool.available_size(),
            out_of_bounds_tokens=self.oob,
            decode_steps=self.steps,
            max_watermark=self.max_watermark,
            draft_pool_page_size=self.draft_page,
            draft_pool_valid_rows=self.draft_valid_rows,
            missing_draft_rows=len(self.missing),
            peak_token_usage=self.peak_used / (self.pages_total * self.alloc_page),
            target_pool_valid_rows=self.target_valid_rows,
            missing_target_rows=len(self.missing_target),
            first_missing_target_usage=self.first_missing_target_usage,
            row_violations=self.violations,
            request_rows=self.request_rows,
            sglang_classes={
                **self.classes.provenance(),
                "alloc_extend": "release"
                if self.alloc_page == 1 or self.classes.alloc_extend_on_host
                else "host-naive",
            },
        )
