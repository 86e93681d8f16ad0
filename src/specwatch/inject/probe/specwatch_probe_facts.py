"""The facts the specwatch probe reads from SGLang's scheduler process (``sitecustomize`` beside
this file attaches them to ``get_internal_state``): req_to_token, the token-to-KV allocator, the
target and draft KV pools, the tree cache, SGLang's own leak check and startup phases, token usage
and the decode watermark's unrecorded tail. Dependency-free: it runs inside every SGLang process."""

import os
import sys
import time

_PROCESS_T0 = time.perf_counter()
"""When this process loaded site (interpreter start, before any SGLang import)."""


def _nbytes(t):
    try:
        return int(t.numel() * t.element_size())
    except Exception:
        return None


def _buffer_rows(pool):
    """Rows (slots) of the pool's first per-layer KV buffer: the slot indices that exist."""
    for name in ("kv_buffer", "k_buffer"):
        bufs = getattr(pool, name, None)
        try:
            if bufs is not None and len(bufs):
                return int(bufs[0].shape[0])
        except Exception:
            pass
    return None


def _pool_facts(pool):
    if pool is None:
        return None
    out = {
        "class": type(pool).__name__,
        "size": getattr(pool, "size", None),
        "page_size": getattr(pool, "page_size", None),
        "dtype": str(getattr(pool, "dtype", "")),
        "rows": _buffer_rows(pool),
    }
    try:
        k, v = pool.get_kv_size_bytes()
        out["bytes"] = int(k + v)
    except Exception:
        total = 0
        for name in ("k_buffer", "v_buffer", "kv_buffer"):
            for t in getattr(pool, name, None) or []:
                total += _nbytes(t) or 0
        out["bytes"] = total or None
    return out


def _find(obj, attr, depth=3, seen=None):
    """First value of ``attr`` found on obj or its attributes (breadth-first, a few levels)."""
    seen = seen if seen is not None else set()
    frontier = [obj]
    for _ in range(depth):
        nxt = []
        for o in frontier:
            if o is None or id(o) in seen:
                continue
            seen.add(id(o))
            val = getattr(o, attr, None)
            if val is not None:
                return val
            for name in ("draft_worker", "draft_runner", "draft_model_runner", "model_runner", "worker"):
                child = getattr(o, name, None)
                if child is not None:
                    nxt.append(child)
        frontier = nxt
    return None


def _attention_backend_facts(sched):
    """The target's attention backend class, and whether its module's source mentions DCP at all.
    A backend whose source never does cannot shard its KV writes by DCP rank: it writes each token
    at the allocator's virtual slot (SGLang 0.5.17: flashinfer_backend.py and
    flashattention_backend.py; on 2xH200 flashinfer at dcp 2 ran, then asserted near full)."""
    import inspect

    try:
        backend = sched.tp_worker.model_runner.attn_backend
    except AttributeError:
        return None
    module = sys.modules.get(type(backend).__module__)
    try:
        mentions = "dcp" in inspect.getsource(module).lower()
    except Exception:
        mentions = None
    return {"class": type(backend).__name__, "module": type(backend).__module__, "mentions_dcp": mentions}


def scheduler_facts(sched):
    """What the scheduler holds: req_to_token, the allocator and its KV pools (target and draft), the
    radix cache, SGLang's own leak check, its startup phases and admission limits, CUDA memory."""
    import torch

    a = sched.token_to_kv_pool_allocator
    facts = {"req_to_token": _req_to_token_facts(sched.req_to_token_pool), "allocator": _allocator_facts(a)}
    facts["target_kv_pool"] = _pool_facts(a.get_kvcache())
    args = getattr(sched, "server_args", None)
    facts["dcp_size"] = int(getattr(args, "dcp_size", 1) or 1)
    try:
        facts["target_attention_backend"] = _attention_backend_facts(sched)
    except Exception:
        facts["target_attention_backend"] = None
    draft = getattr(sched, "draft_worker", None)
    draft_pool = _find(draft, "token_to_kv_pool") if draft is not None else None
    # NGRAM's worker has no pool of its own: what it finds is the target's (not a draft pool)
    facts["draft_kv_pool"] = None if draft_pool is None or draft_pool is a.get_kvcache() else _pool_facts(draft_pool)
    facts.update(_tree_cache_facts(getattr(sched, "tree_cache", None)))
    facts.update(_leak_check_facts(sched))
    facts["startup"] = startup_facts(sched)
    # the scheduler's admission limits as it resolved them (a near-full batch must fit them all)
    facts["scheduler_limits"] = {
        k: getattr(sched, k, None) for k in ("max_running_requests", "chunked_prefill_size", "max_prefill_tokens")
    }
    if torch.cuda.is_available():
        facts["cuda"] = {
            "max_allocated": torch.cuda.max_memory_allocated(),
            "allocated": torch.cuda.memory_allocated(),
            "max_reserved": torch.cuda.max_memory_reserved(),
        }
    return facts


def _req_to_token_facts(r):
    """The req_to_token pool: its table's shape, dtype and bytes, row width, size and free slots."""
    t = r.req_to_token
    return {
        "shape": list(t.shape),
        "dtype": str(t.dtype),
        "bytes": _nbytes(t),
        "row_width": int(t.shape[1]),
        "size": r.size,
        "free_slots": len(r.free_slots),
    }


def _allocator_facts(a):
    """The token-to-KV allocator: class, size, page, free pages (those waiting for release too) and
    how many of them are distinct (a page freed twice shows as fewer unique than free)."""
    import torch

    release = getattr(a, "release_pages", None)
    free_pages = len(a.free_pages) + (len(release) if release is not None else 0)
    unique_free = None
    try:
        pages = a.free_pages if release is None or len(release) == 0 else torch.cat((a.free_pages, release))
        unique_free = int(torch.unique(pages).numel())
    except Exception:
        pass
    return {
        "class": type(a).__name__,
        "size": a.size,
        "page_size": a.page_size,
        "available": int(a.available_size()),
        "free_pages": free_pages,
        "unique_free_pages": unique_free,
        "num_pages": getattr(a, "num_pages", a.size // max(a.page_size, 1)),
    }


def _tree_cache_facts(tc):
    """The radix cache's evictable and protected sizes (``tree_cache_*``), those it reports."""
    facts = {}
    if tc is not None:
        for name in ("evictable_size", "protected_size"):
            try:
                facts[f"tree_cache_{name}"] = int(getattr(tc, name)())
            except Exception:
                pass
    return facts


def _leak_check_facts(sched):
    """SGLang's own idle-time leak check (0.5.17: on the scheduler's invariant_checker; older: on
    the scheduler). With SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE (default on) a leak raises in
    the scheduler, so a run that gets here has a clean verdict or counted warnings."""
    holder = getattr(sched, "invariant_checker", None) or sched
    return {
        "leak_warnings": {
            k: getattr(holder, k, None) for k in ("count_memory_leak_warnings", "count_req_pool_leak_warnings")
        },
        "strict_idle_check": os.environ.get("SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE", "default (on)"),
    }


def startup_facts(sched):
    """Where the scheduler's start went, in seconds: SGLang's own breakdown where it keeps one
    (0.5.17: ``Scheduler.startup_time``: weight loading, KV allocation, CUDA-graph capture, the
    scheduler's constructor end to end) plus ``process_to_scheduler_init``, from this process's
    interpreter start to the constructor (SGLang's imports). None when neither is there."""
    import json

    out = {}
    own = getattr(sched, "startup_time", None)
    if isinstance(own, dict):
        out.update(json.loads(json.dumps(own, default=str)))
    begin = getattr(sched, "scheduler_startup_begin", None)
    if isinstance(begin, float):
        out["process_to_scheduler_init"] = round(begin - _PROCESS_T0, 3)
    return out or None


NEAR_FULL = 0.95
"""Token usage above which a batch counts as near-full (seed 004's faults only show there)."""


def token_usage(sched) -> float:
    """Share of the KV pool held by requests (not free, not evictable cache) right now."""
    a = sched.token_to_kv_pool_allocator
    evictable = 0
    tc = getattr(sched, "tree_cache", None)
    if tc is not None:
        try:
            evictable = int(tc.evictable_size())
        except Exception:
            pass
    return 1.0 - (int(a.available_size()) + evictable) / max(int(a.size), 1)


def unrecorded_tail(sched, batch) -> int:
    """KV slots allocated to the batch's requests but not recorded: the distance of each request's
    ``kv_allocated_len`` (0.5.19+: ``req.kv.kv_allocated_len``) up to a whole allocator page,
    summed. The paged allocator hands out whole pages, so a watermark rounded up to a page leaves
    0 after every decode step (``allocation_sizing.page_aligned_decode_alloc_lens``: "allocated ==
    recorded"); an unaligned one leaves the partial last page unrecorded."""
    ps = int(getattr(sched.token_to_kv_pool_allocator, "page_size", 1) or 1)
    if ps <= 1:
        return 0
    tail = 0
    for r in getattr(batch, "reqs", ()) or ():
        n = getattr(getattr(r, "kv", r), "kv_allocated_len", None)
        if isinstance(n, int) and n > 0:
            tail += -n % ps
    return tail
