"""The planted decode slowdowns (slow-verify-*): every EAGLE verify step of the installed SGLang
spins the fault's microseconds of host time, or queues them as GPU time (slow-verify-gpu-*), and
nothing else changes."""

import time
from types import SimpleNamespace

import pytest

from specwatch.inject import faults, stalls
from specwatch.rules.release_ranges import ADAPTERS
from specwatch.rules.releases import fault_plan

pytestmark = pytest.mark.sglang


class _Stop(Exception):
    """Raised by the fake batch right after the edit's spin (at ``bs = len(batch.seq_lens)``)."""


class _SeqLens:
    def __len__(self):
        raise _Stop


def _verify_seconds(verify) -> float:
    """Seconds 0.5.17's ``run_eagle_verify`` takes up to ``bs = len(batch.seq_lens)`` (CPU, no model)."""
    batch = SimpleNamespace(spec_info=None, seq_lens=_SeqLens(), req_pool_indices=None, input_ids=None)
    batch.out_cache_loc = None
    kw = dict(target_worker=None, req_to_token_pool=None, token_to_kv_pool_allocator=None, plan_stream=None)
    kw.update(plan_stream_ctx=None, topk=1, num_steps=1, num_draft_tokens=2, device="cpu")
    t = time.perf_counter()
    with pytest.raises(_Stop):
        verify(batch, **kw, metadata_ready_pre_pad=False, finalize_tree_path=False)
    return time.perf_counter() - t


def _recorded(monkeypatch) -> list:
    """``stalls.stall`` (the host spin the edit calls by name at each step) wrapped to record its
    microseconds: what ran is counted, not timed (a loaded host stretches any call's wall time)."""
    calls, spin = [], stalls.stall
    monkeypatch.setattr(stalls, "stall", lambda micros: calls.append(micros) or spin(micros))
    return calls


def test_slow_verify_spins_each_verify_step_of_the_installed_sglang_and_restores(monkeypatch):
    from specwatch.core.sglang_host import _quiet_import

    plan = fault_plan("slow-verify-2000us")
    assert plan.modules == ("sglang.srt.speculative.eagle_worker_common",)
    mod = _quiet_import(plan.modules[0])
    spins = _recorded(monkeypatch)
    _verify_seconds(mod.run_eagle_verify)  # first call: imports and caches
    assert spins == []  # the clean step spins nothing
    before = faults.HITS["slow-verify-2000us"]
    with faults.applied(plan):
        slow = _verify_seconds(mod.run_eagle_verify)
        assert faults.HITS["slow-verify-2000us"] == before + 1
    assert spins == [2000] and slow >= 0.002  # the spin's lower bound holds however loaded the host
    _verify_seconds(mod.run_eagle_verify)
    assert spins == [2000]  # restored


def test_stall_spins_at_least_its_microseconds():
    t = time.perf_counter()
    stalls.stall(300)
    assert time.perf_counter() - t >= 300e-6


def test_every_release_edits_its_eagle_verify_step():
    """0.5.12-0.5.15 verify in ``EAGLEWorkerV2.verify``, 0.5.16 on in ``run_eagle_verify`` (the
    match text and the patcher are checked against each release's source by test_releases)."""
    for a in ADAPTERS:
        for table, call in ((stalls.SLOW_VERIFY_US, ".stall"), (stalls.SLOW_VERIFY_GPU_US, ".gpu_stall")):
            for name, micros in table.items():
                site = a.faults[name]
                assert site.target.endswith(("EAGLEWorkerV2.verify", "run_eagle_verify")), (a.first, site.target)
                assert f"{call}({micros})" in site.replacement
    assert fault_plan("slow-verify-100us", "0.5.12").modules == ("sglang.srt.speculative.eagle_worker_v2",)


class _FakeCuda:
    """``torch.cuda`` as far as ``gpu_stall`` reads it: available, capturing or not, sleeps recorded."""

    def __init__(self, capturing=False):
        self.capturing, self.slept = capturing, []

    def is_available(self):
        return True

    def is_current_stream_capturing(self):
        return self.capturing

    def _sleep(self, cycles):
        self.slept.append(cycles)


def test_the_gpu_slowdown_queues_its_microseconds_of_gpu_cycles_in_each_verify_step(monkeypatch):
    import torch

    from specwatch.core.sglang_host import _quiet_import

    plan = fault_plan("slow-verify-gpu-500us")
    assert plan.modules == ("sglang.srt.speculative.eagle_worker_common",)
    mod = _quiet_import(plan.modules[0])  # imported with the real torch.cuda
    cuda = _FakeCuda()
    monkeypatch.setattr(torch, "cuda", cuda)
    monkeypatch.setattr(stalls, "cycles_per_us", lambda: 1980.0)
    spins = _recorded(monkeypatch)
    before = faults.HITS["slow-verify-gpu-500us"]
    with faults.applied(plan):
        _verify_seconds(mod.run_eagle_verify)
        assert faults.HITS["slow-verify-gpu-500us"] == before + 1
    assert cuda.slept == [990_000] and spins == []  # queued on the GPU: the host does not spin
    _verify_seconds(mod.run_eagle_verify)
    assert cuda.slept == [990_000]  # restored


def test_the_gpu_slowdown_queues_nothing_into_a_cuda_graph_being_captured(monkeypatch):
    import torch

    cuda = _FakeCuda(capturing=True)
    monkeypatch.setattr(torch, "cuda", cuda)
    stalls.gpu_stall(500)
    assert cuda.slept == []
    cuda.capturing = False
    monkeypatch.setattr(stalls, "cycles_per_us", lambda: 1000.0)
    stalls.gpu_stall(500)
    assert cuda.slept == [500_000]


def test_the_gpu_null_fault_queues_nothing_and_counts_its_hit(monkeypatch):
    import torch

    from specwatch.core.sglang_host import _quiet_import

    plan = fault_plan(stalls.NULL_GPU_SLOWDOWN)
    mod = _quiet_import(plan.modules[0])
    cuda = _FakeCuda()
    monkeypatch.setattr(torch, "cuda", cuda)
    before = faults.HITS[stalls.NULL_GPU_SLOWDOWN]
    with faults.applied(plan):
        _verify_seconds(mod.run_eagle_verify)
    assert faults.HITS[stalls.NULL_GPU_SLOWDOWN] == before + 1 and cuda.slept == []
