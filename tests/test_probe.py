"""The probe's scheduler patch on a stand-in Scheduler (no SGLang): facts attached to the
internal state, and token-usage sampling per batch, reset at each read."""

import types

import pytest

from specwatch.cpu.probe_cost import load_probe

torch = pytest.importorskip("torch")


class Allocator:
    size, page_size = 1000, 1

    def __init__(self):
        self.free_pages = torch.arange(1000)
        self.used = 0

    def available_size(self):
        return self.size - self.used

    def get_kvcache(self):
        return None


class Scheduler:
    def __init__(self):
        self.token_to_kv_pool_allocator = Allocator()
        self.req_to_token_pool = types.SimpleNamespace(
            req_to_token=torch.zeros(4, 8, dtype=torch.int32), size=4, free_slots=[0, 1, 2, 3]
        )
        self.tree_cache = None

    def run_batch(self, batch):
        return batch

    def get_internal_state(self, recv_req):
        return {}


def test_occupancy_is_sampled_per_batch_and_reset_on_read():
    probe = load_probe()
    probe._patch_scheduler(types.SimpleNamespace(Scheduler=Scheduler))
    s = Scheduler()
    decode = types.SimpleNamespace(forward_mode=types.SimpleNamespace(is_decode=lambda: True), reqs=[1, 2, 3])
    decode2 = types.SimpleNamespace(forward_mode=types.SimpleNamespace(is_decode=lambda: True), reqs=[1, 2])
    prefill = types.SimpleNamespace(forward_mode=types.SimpleNamespace(is_decode=lambda: False))
    for used, batch in ((100, prefill), (960, decode), (990, prefill), (500, decode), (970, "no mode"), (700, decode2)):
        s.token_to_kv_pool_allocator.used = used
        assert s.run_batch(batch) is batch
    facts = s.get_internal_state(None)["specwatch"]
    assert 0 < facts["occupancy"].pop("probe_s") < 0.1  # its own cost, six samples
    assert facts["occupancy"] == {
        "batches": 6,
        "near_full": 3,
        "peak": 0.99,
        "decode_batches": 3,
        "decode_near_full": 1,
        "decode_peak": 0.96,
        "decode_peak_requests": 3,
        "max_decode_requests": 3,
        "decode_waiting_max": 0,
        "decode_unrecorded_tail_max": 0,
        "decode_unaligned_batches": 0,
        "retracted_requests": 0,
    }
    assert facts["scheduler_limits"] == {
        "max_running_requests": None,
        "chunked_prefill_size": None,
        "max_prefill_tokens": None,
    }
    assert facts["req_to_token"]["row_width"] == 8 and facts["allocator"]["available"] == 300
    assert s.get_internal_state(None)["specwatch"]["occupancy"] is None  # reset: a new case starts


@pytest.mark.parametrize("layout", ["kv", "flat"])
def test_kv_allocated_past_a_requests_record_is_counted_after_each_decode_step(layout):
    """Seed 003's invariant: with whole-page decode watermarks every request's kv_allocated_len is
    a page multiple after its decode step; an unaligned one leaves the page's rest unrecorded.
    0.5.19+ keep the length on ``req.kv``, older releases on the request."""
    probe = load_probe()

    class Fresh(Scheduler):  # a class of its own: the probe wraps the methods it finds on it
        def run_batch(self, batch):
            return batch

        def get_internal_state(self, recv_req):
            return {}

    probe._patch_scheduler(types.SimpleNamespace(Scheduler=Fresh))
    s = Fresh()
    s.token_to_kv_pool_allocator.page_size = 64

    def req(n):
        return (
            types.SimpleNamespace(kv=types.SimpleNamespace(kv_allocated_len=n))
            if layout == "kv"
            else (types.SimpleNamespace(kv_allocated_len=n))
        )

    def decode(*lens):
        return types.SimpleNamespace(
            forward_mode=types.SimpleNamespace(is_decode=lambda: True), reqs=[req(n) for n in lens]
        )

    prefill = types.SimpleNamespace(forward_mode=types.SimpleNamespace(is_decode=lambda: False), reqs=[req(500)])
    for batch in (prefill, decode(512, 1024), decode(520, 1030), decode(576, 1088)):
        s.run_batch(batch)
    occ = s.get_internal_state(None)["specwatch"]["occupancy"]
    assert occ["decode_unrecorded_tail_max"] == (576 - 520) + (1088 - 1030)
    assert occ["decode_unaligned_batches"] == 1  # a prefill's unaligned length is not a decode watermark


def test_the_target_attention_backend_is_named_with_whether_its_source_knows_dcp(monkeypatch, tmp_path):
    import sys

    probe = load_probe()
    for name, body, knows in (
        ("sw_backend_plain", "class Backend:\n    pass\n", False),
        ("sw_backend_dcp", "class Backend:\n    dcp_size = 2\n", True),
    ):
        (tmp_path / f"{name}.py").write_text(body)
        monkeypatch.syspath_prepend(str(tmp_path))
        module = __import__(name)
        s = Scheduler()
        s.tp_worker = types.SimpleNamespace(model_runner=types.SimpleNamespace(attn_backend=module.Backend()))
        facts = probe.scheduler_facts(s)
        assert facts["target_attention_backend"] == {"class": "Backend", "module": name, "mentions_dcp": knows}
        del sys.modules[name]
    assert probe.scheduler_facts(Scheduler())["target_attention_backend"] is None  # no tp_worker: not judged


def test_start_breakdown_reads_sglangs_own_startup_timing():
    """0.5.17's scheduler keeps ``startup_time`` (build_scheduler_startup_time) and the perf_counter
    its constructor began at; the probe adds the time from interpreter start to that constructor."""
    import time

    probe = load_probe()
    assert probe.scheduler_facts(Scheduler())["startup"] is None  # an SGLang without either
    s = Scheduler()
    s.scheduler_startup_begin = probe._PROCESS_T0 + 12.5
    s.startup_time = {
        "load_weight": 1.25,
        "kv_cache_allocation": 0.5,
        "scheduler_e2e": 20.0,
        "cuda_graph": {"decode": 3.0},
    }
    facts = probe.scheduler_facts(s)["startup"]
    assert facts == {
        "load_weight": 1.25,
        "kv_cache_allocation": 0.5,
        "scheduler_e2e": 20.0,
        "cuda_graph": {"decode": 3.0},
        "process_to_scheduler_init": 12.5,
    }
    assert probe._PROCESS_T0 <= time.perf_counter()


def test_requests_retracted_from_decode_are_counted_until_the_next_read():
    """SGLang's retract_decode (KV pool too full for the next step) returns the retracted requests
    first; the probe counts them into the case's occupancy and starts again from 0."""
    probe = load_probe()

    class Sched(Scheduler):  # unpatched methods of its own (another test patched Scheduler's)
        def run_batch(self, batch):
            return batch

        def get_internal_state(self, recv_req):
            return {}

    probe._patch_scheduler(types.SimpleNamespace(Scheduler=Sched))

    class ScheduleBatch:
        def retract_decode(self, server_args):
            return ["r1", "r2"], 0.5, []

    probe._patch_retract(types.SimpleNamespace(ScheduleBatch=ScheduleBatch))
    s = Sched()
    s.run_batch(types.SimpleNamespace(forward_mode=types.SimpleNamespace(is_decode=lambda: True), reqs=[1]))
    assert ScheduleBatch().retract_decode(None) == (["r1", "r2"], 0.5, [])
    assert s.get_internal_state(None)["specwatch"]["occupancy"]["retracted_requests"] == 2
    s.run_batch(types.SimpleNamespace(forward_mode=None))
    assert s.get_internal_state(None)["specwatch"]["occupancy"]["retracted_requests"] == 0


def test_the_probes_per_batch_cost_on_sglangs_own_allocator_is_microseconds():
    """The probe's only work on SGLang's hot path, timed on the CPU with SGLang's real allocators: a
    few microseconds (2-6 us measured here), against decode steps of 1-12 ms on the H200. A sample
    that synchronised a device, copied the free list or scanned it would cost far more."""
    from specwatch.core.sglang_host import sglang_importable

    if not sglang_importable():
        pytest.skip("sglang is not importable here")
    from specwatch.cpu.probe_cost import sample_cost_us

    for page in (1, 64):
        assert sample_cost_us(page, batches=500) < 80.0


def test_a_fault_runs_edited_code_is_counted_per_case(monkeypatch):
    """Each fault's edit calls specwatch.inject.faults.hit; the probe hands the active fault's count so far
    in this engine to each case (a total: sizing edits run once, at start-up), so a fault run can
    say whether the faulted code ran at all."""
    from specwatch.inject import faults

    probe = load_probe()

    class Sched(Scheduler):
        def run_batch(self, batch):
            return batch

        def get_internal_state(self, recv_req):
            return {}

    probe._patch_scheduler(types.SimpleNamespace(Scheduler=Sched))
    s = Sched()
    assert "fault_code_runs" not in s.get_internal_state(None)["specwatch"]  # a clean run
    monkeypatch.setenv("SPECWATCH_FAULT", "accept-off-by-one")
    monkeypatch.setattr(faults, "HITS", faults.Counter())
    faults.hit("accept-off-by-one"), faults.hit("accept-off-by-one")
    assert s.get_internal_state(None)["specwatch"]["fault_code_runs"] == 2
    faults.hit("accept-off-by-one")
    assert s.get_internal_state(None)["specwatch"]["fault_code_runs"] == 3
    monkeypatch.setenv("SPECWATCH_FAULT", "unaligned-watermark")
    assert s.get_internal_state(None)["specwatch"]["fault_code_runs"] == 0  # never ran
