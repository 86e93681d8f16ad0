"""What specwatch's probe costs SGLang per batch, measured on the CPU with SGLang's own allocator.

The probe (``specwatch/probe/sitecustomize.py``) adds one thing to SGLang's hot path: before every
batch the scheduler runs, it reads the allocator's free size and the tree cache's evictable size
and updates a few counters. Here that wrapper runs on a stand-in scheduler holding SGLang's real
token allocator (the CPU tier's ``sim_pools.make_allocator``), so its cost is a measured number
in CI, next to the GPU records' own ``probe_time_per_batch`` and step time
(``specwatch overhead``).
"""

from __future__ import annotations

import importlib.util
import os
import time
import types
from pathlib import Path

PROBE_FILE = Path(__file__).resolve().parents[1] / "inject" / "probe" / "sitecustomize.py"


def load_probe():
    """The probe module, loaded without installing its import hook in this process."""
    before = os.environ.get("SPECWATCH_PROBE")
    os.environ["SPECWATCH_PROBE"] = "0"
    try:
        spec = importlib.util.spec_from_file_location("specwatch_probe_measured", PROBE_FILE)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        if before is None:
            os.environ.pop("SPECWATCH_PROBE")
        else:
            os.environ["SPECWATCH_PROBE"] = before


class _Scheduler:
    """The scheduler attributes the probe's per-batch sample reads."""

    def __init__(self, allocator):
        self.token_to_kv_pool_allocator = allocator
        self.tree_cache = types.SimpleNamespace(evictable_size=lambda: 0)
        self.waiting_queue = []

    def run_batch(self, batch):
        return batch


def sample_cost_us(page_size: int, pool_tokens: int = 1 << 18, requests: int = 16, batches: int = 2000) -> float:
    """Microseconds the probe adds to one decode batch: its wrapper around ``run_batch`` minus the
    bare call, on SGLang's allocator with ``requests`` requests' pages handed out."""
    from specwatch.cpu.sim_pools import make_allocator

    probe = load_probe()
    alloc = make_allocator(pool_tokens, page_size)
    alloc.alloc(requests * 64 * page_size)  # a busy pool: pages handed out

    class Probed(_Scheduler):
        pass

    probe._patch_run_batch(Probed)
    mode = types.SimpleNamespace(is_decode=lambda: True)
    batch = types.SimpleNamespace(forward_mode=mode, reqs=list(range(requests)))

    def per_call(sched) -> float:
        run = sched.run_batch
        run(batch)
        t = time.perf_counter()
        for _ in range(batches):
            run(batch)
        return (time.perf_counter() - t) / batches

    return max(0.0, per_call(Probed(alloc)) - per_call(_Scheduler(alloc))) * 1e6
