import pytest

from specwatch.cpu.allocator_sim import AcceptPattern, SimConfig, simulate
from specwatch.inject.faults import SimFault

pytestmark = pytest.mark.sglang


@pytest.mark.parametrize("page,topk,draft", [(16, 1, 4), (16, 4, 8), (64, 8, 16), (256, 8, 16), (1, 1, 4)])
@pytest.mark.parametrize("accept", list(AcceptPattern))
def test_no_leak_on_installed_sizing(page, topk, draft, accept):
    res = simulate(SimConfig(page, topk, 3, draft, accept=accept))
    assert res.clean, res.as_dict()
    assert res.free_pages_after == res.pool_pages and res.decode_steps > 0


def test_planted_seed_bug_is_reported():
    # PR #26972 reverted: row headroom back to 4 + num_draft_tokens at page 64, topk 8
    res = simulate(SimConfig(64, 8, 3, 16, fault=SimFault.row_widen_revert, accept=AcceptPattern.random))
    assert res.row_width == 512 + 4 + 16
    assert res.row_violations and res.row_violations[0].watermark > res.row_width
    assert res.leaked_pages > 0 and res.leaked_tokens == res.leaked_pages * 64
    assert not res.clean


def test_dcp_pages_allocator_in_virtual_slots():
    far = simulate(SimConfig(64, 1, 3, 4, dcp=8, context_len=4096, input_len=300, output_len=300))
    assert far.allocator_page_size == 512 and far.clean
    # Finding (0.5.17): the watermark is rounded to the allocator's page (64 * 8 = 512 slots) but
    # the row headroom only to the server page (64): near the context limit the row overflows.
    near = simulate(SimConfig(64, 1, 3, 4, dcp=8, accept=AcceptPattern.one))
    assert near.row_violations and near.row_violations[0].watermark == 1024 > near.row_width == 512 + 71


def test_page1_tree_overshoots_row_near_context_limit():
    # Finding (0.5.17): page 1, topk 8, draft 16: row headroom 4+16 = 20, watermark reserve 48,
    # admission reserve 24: the longest admitted request's last steps pass its row by up to 3 slots.
    # The simulation reports it, it does not crash.
    from specwatch.core.case import Algorithm

    res = simulate(SimConfig(1, 8, 3, 16, accept=AcceptPattern.one))
    assert res.row_violations and not res.clean
    assert max(v.watermark - v.row_width for v in res.row_violations) == 3
    assert simulate(SimConfig(1, 4, 3, 8, accept=AcceptPattern.one)).clean  # covered by admission
    standalone = simulate(SimConfig(1, 4, 3, 8, accept=AcceptPattern.one, algorithm=Algorithm.STANDALONE))
    assert standalone.row_violations and not standalone.clean


@pytest.mark.parametrize("dcp,missing", [(2, 64), (4, 192), (8, 448)])
def test_draft_pool_paged_smaller_than_allocator_reaches_missing_rows_near_full(dcp, missing):
    # Seed 004: allocator page N spans [size, size + 64*dcp); a draft pool paged by 64 is valid to
    # size + 64 only. TP8/DCP8 with a 64-slot base page: 448 rows that do not exist.
    cfg = dict(context_len=8192, input_len=1500, output_len=300, dcp=dcp)
    faulty = simulate(SimConfig(64, 1, 3, 4, near_full=True, fault=SimFault.draft_page_mismatch, **cfg))
    assert faulty.peak_token_usage == 1.0 and faulty.missing_draft_rows == missing and not faulty.clean
    fixed = simulate(SimConfig(64, 1, 3, 4, near_full=True, **cfg))  # 0.5.17 pages the draft pool by 64*dcp
    assert fixed.draft_pool_page_size == 64 * dcp and fixed.missing_draft_rows == 0 and fixed.clean
    roomy = simulate(SimConfig(64, 1, 3, 4, fault=SimFault.draft_page_mismatch, **cfg))
    assert roomy.missing_draft_rows == 0  # far from full the fault stays silent


@pytest.mark.parametrize("dcp", [2, 4, 8])
def test_a_kv_write_that_ignores_dcp_leaves_the_per_rank_pool_past_one_over_dcp_usage(dcp):
    # Seen on 2xH200 (SGLang 0.5.17, flashinfer MHA, dcp 2): outputs right at ~1% usage, a
    # store_kvcache bounds assertion near full. A backend that writes at the allocator's virtual slot
    # into a per-rank pool of size / dcp + page rows runs out of rows once usage passes 1 / dcp.
    cfg = dict(context_len=8192, input_len=1500, output_len=300, dcp=dcp)
    unsharded = simulate(SimConfig(64, 1, 3, 4, near_full=True, kv_write_ignores_dcp=True, **cfg))
    assert unsharded.target_pool_valid_rows == unsharded.pool_pages * 64 + 64
    assert unsharded.missing_target_rows > 0 and not unsharded.clean
    assert 1 / dcp <= unsharded.first_missing_target_usage <= 1 / dcp + 1 / 4  # a request is 1/4 of the pool
    sharded = simulate(SimConfig(64, 1, 3, 4, near_full=True, **cfg))  # what DCP backends do
    assert sharded.missing_target_rows == 0 and sharded.first_missing_target_usage is None and sharded.clean


def test_an_unsharded_kv_write_is_silent_below_one_over_dcp_usage():
    low = simulate(
        SimConfig(64, 1, 3, 4, context_len=8192, input_len=1500, output_len=300, dcp=2, kv_write_ignores_dcp=True)
    )
    assert low.peak_token_usage < 0.5 and low.missing_target_rows == 0 and low.clean


def _release_or_skip(version):
    import os

    from specwatch.rules.release_sizing import REQUIRE_ENV, SglangSource

    if SglangSource.cached(version) is None:
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{REQUIRE_ENV}=1 but SGLang {version}'s source is not unpacked")
        pytest.skip(f"no unpacked SGLang {version}: run scripts/fetch_sglang_sources.sh")
    return version


@pytest.mark.parametrize("release", [None, "0.5.23"])
@pytest.mark.parametrize("page", [16, 64, 256])
@pytest.mark.parametrize("accept", list(AcceptPattern))
def test_dflash_runs_clean_on_paged_kv(release, page, accept):
    from specwatch.rules.memory_model import ModelAlgorithm

    release = release and _release_or_skip(release)
    res = simulate(SimConfig(page, 1, 3, 16, algorithm=ModelAlgorithm.DFLASH, accept=accept, release=release))
    assert res.reserve == 32 and res.clean, res.as_dict()


@pytest.mark.parametrize("release", [None, "0.5.23"])
def test_dflash_row_overflows_at_page_1_near_the_context_limit(release):
    # Finding (0.5.17 and 0.5.23): DFLASH's watermark is committed + 2 * block_size (32 at draft 16)
    # but a page-1 row has 4 + 16 slots of headroom and DFLASH admits C - 1 tokens: the longest
    # request's last steps pass the row by up to 10 slots (into the next request's row).
    from specwatch.rules.memory_model import ModelAlgorithm

    release = release and _release_or_skip(release)
    res = simulate(SimConfig(1, 1, 3, 16, algorithm=ModelAlgorithm.DFLASH, accept=AcceptPattern.one, release=release))
    assert res.row_violations and not res.clean
    assert max(v.watermark - v.row_width for v in res.row_violations) == 10
    fits = simulate(SimConfig(1, 1, 3, 6, algorithm=ModelAlgorithm.DFLASH, accept=AcceptPattern.one, release=release))
    assert fits.clean  # block 6: the last watermark C - 2 + 12 is the row's end C + 4 + 6


def test_dflash_watermark_is_unaligned_on_0_5_17_and_page_aligned_on_0_5_23():
    from specwatch.rules.memory_model import ModelAlgorithm

    cfg = dict(algorithm=ModelAlgorithm.DFLASH, accept=AcceptPattern.one)
    old = simulate(SimConfig(64, 1, 3, 16, release=_release_or_skip("0.5.17"), **cfg))
    new = simulate(SimConfig(64, 1, 3, 16, release=_release_or_skip("0.5.23"), **cfg))
    assert new.max_watermark % 64 == 0 and old.max_watermark % 64 != 0
    assert old.clean and new.clean


def test_planted_seed_bug_is_reported_with_0_5_23_sizing():
    res = simulate(
        SimConfig(
            64,
            8,
            3,
            16,
            fault=SimFault.row_widen_revert,
            accept=AcceptPattern.random,
            release=_release_or_skip("0.5.23"),
        )
    )
    assert res.row_violations and res.leaked_pages > 0 and not res.clean
    assert simulate(SimConfig(64, 8, 3, 16, accept=AcceptPattern.random, release="0.5.23")).clean
