import pytest

from specwatch.core.case import Algorithm
from specwatch.cpu.allocator_sim import AcceptPattern, SimConfig, simulate
from specwatch.inject import faults
from specwatch.rules.memory_model import SizingInput, compare
from specwatch.rules.releases import FaultNotInRelease, fault_plan

pytestmark = pytest.mark.sglang


@pytest.mark.parametrize("name", list(faults.FAULTS))
def test_every_fault_applies_to_installed_sglang_and_restores(name):
    from specwatch.core.sglang_host import _quiet_import

    plan = fault_plan(name)
    for module in plan.modules:
        try:
            _quiet_import(module)
        except ModuleNotFoundError as e:  # DFLASH's worker imports the serving stack
            assert not (e.name or "").startswith("sglang"), e
            continue
        with faults.applied(plan, module) as f:
            assert f.name == name
        # applying twice after restore works: the original source is back
        with faults.applied(plan, module):
            pass


def test_row_widen_revert_is_caught_by_the_cpu_tier():
    x = SizingInput(Algorithm.EAGLE, 64, 8, 3, 16, 512, 4)
    assert compare(x)[2] == []
    before = faults.HITS["row-widen-revert"]
    with faults.applied(fault_plan("row-widen-revert")):
        _, _, diffs = compare(x)
        assert faults.HITS["row-widen-revert"] > before  # the edit counts its own runs
        assert {d.field for d in diffs} == {
            "req_to_token_extra_context_len",
            "req_to_token_row_width",
            "req_to_token_bytes",
        }
        res = simulate(SimConfig(64, 8, 3, 16, accept=AcceptPattern.random))  # SGLang's (patched) sizing
        assert res.leaked_pages > 0 and res.row_violations
    assert compare(x)[2] == [] and simulate(SimConfig(64, 8, 3, 16, accept=AcceptPattern.random)).clean


def test_unknown_fault():
    with pytest.raises(ValueError, match="unknown fault"):
        faults.get("nope")


def test_draft_page_mismatch_changes_the_draft_pool_page():
    from types import SimpleNamespace

    from sglang.srt.mem_cache import kv_cache_configurator as kcc

    fake = SimpleNamespace(server_args=SimpleNamespace(dcp_size=8), is_draft_worker=True)
    prop = kcc.KVCacheConfigurator.__dict__["pool_page_size"]
    orig_sched = kcc.get_schedule
    kcc.get_schedule = lambda: SimpleNamespace(page_size=64)
    try:
        fake.loc_space_scale = kcc.KVCacheConfigurator.loc_space_scale.fget(fake)
        assert prop.fget(fake) == 512  # 0.5.17: the draft pool pages like the allocator
        before = faults.HITS["draft-page-mismatch"]
        with faults.applied(fault_plan("draft-page-mismatch")):
            assert kcc.KVCacheConfigurator.pool_page_size.fget(fake) == 64
        assert faults.HITS["draft-page-mismatch"] == before + 1
        assert kcc.KVCacheConfigurator.__dict__["pool_page_size"] is prop
    finally:
        kcc.get_schedule = orig_sched


def test_a_plan_names_the_release_its_edit_was_made_for_and_survives_the_environment():
    plan = fault_plan("unaligned-watermark", "0.5.23")
    assert plan.release == "0.5.23"
    assert plan.modules == ("sglang.srt.mem_cache.allocation_sizing",)
    assert "page_aligned_decode_alloc_lens" in plan.edits[0].patch_yaml
    assert faults.FaultPlan.from_json(plan.to_json()) == plan


def test_the_unaligned_watermark_edits_the_inline_watermark_before_0_5_19():
    assert fault_plan("unaligned-watermark", "0.5.18").modules == ("sglang.srt.speculative.eagle_utils",)
    assert "eagle_prepare_for_decode" in fault_plan("unaligned-watermark", "0.5.17").edits[0].patch_yaml


def test_a_fault_without_an_edit_in_a_release_is_refused_with_the_release_reason():
    with pytest.raises(FaultNotInRelease, match="0.5.12.*not rounded up"):
        fault_plan("unaligned-watermark", "0.5.12")
    with pytest.raises(FaultNotInRelease, match="pool_page_size"):
        fault_plan("draft-page-mismatch", "0.5.16")


def test_accept_off_by_one_edits_dflash_verify_too_where_dflash_has_its_v2_worker():
    plan = fault_plan("accept-off-by-one", "0.5.23")
    assert plan.modules == ("sglang.srt.speculative.eagle_worker_common", "sglang.srt.speculative.dflash_worker_v2")
    assert "commit_lens - 1" in plan.edits[1].patch_yaml
    assert fault_plan("accept-off-by-one", "0.5.14").modules == ("sglang.srt.speculative.eagle_worker_v2",)
    assert faults.FaultPlan.from_json(plan.to_json()) == plan
