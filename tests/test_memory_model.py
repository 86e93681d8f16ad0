import pytest

from records import SIZING_GRID
from specwatch.core.case import Algorithm
from specwatch.rules.memory_model import (
    COMPARED_FIELDS,
    SizingInput,
    compare,
    reference_sizing,
    release,
)


def test_seed_example_tree_on_paged_kv():
    s = reference_sizing(SizingInput(Algorithm.EAGLE, 64, 8, 3, 16, 4096, 48))
    # ceil((63 + 3) / 64) = 2 pages per branch, 8 branches
    assert s.alloc_len_per_decode == 2 * 64 * 8 == 1024
    assert s.alloc_reserve_per_decode == 2048
    assert s.req_to_token_extra_context_len == 2048 + 63
    assert s.req_to_token_row_width == 4096 + 2111
    assert s.req_to_token_bytes == 49 * 6207 * 4
    assert s.holey_branch_footprint_tokens == 1024
    assert s.row_fits_watermark


def test_chain_and_no_spec():
    chain = reference_sizing(SizingInput(Algorithm.EAGLE, 1, 1, 3, 4, 1024, 8))
    assert (chain.alloc_len_per_decode, chain.req_to_token_extra_context_len) == (4, 8)
    none = reference_sizing(SizingInput(None, 16, 1, 3, 4, 1024, 8))
    assert none.alloc_len_per_decode == 1 and none.req_to_token_extra_context_len == 4
    assert none.row_fits_watermark is None


def test_page1_tree_watermark_vs_row():
    # Finding on 0.5.17's sizing: at page 1 the row headroom stays 4 + num_draft_tokens while the
    # reserve is 2 * max(steps*topk, draft). EAGLE admits requests only up to C - max(steps*topk,
    # draft), which covers the overshoot unless steps*topk > draft + 5; STANDALONE and NGRAM reserve
    # nothing at admission.
    eagle_k8 = reference_sizing(SizingInput(Algorithm.EAGLE, 1, 8, 3, 16, 4096, 48))
    assert eagle_k8.reserved_tokens_at_admission == 24 and eagle_k8.max_seq_len == 4072
    assert eagle_k8.alloc_reserve_per_decode == 48 and eagle_k8.req_to_token_extra_context_len == 20
    assert eagle_k8.aligned_alloc_len_at_context_limit == 4071 + 48 == eagle_k8.req_to_token_row_width + 3
    assert not eagle_k8.row_fits_watermark
    assert reference_sizing(SizingInput(Algorithm.EAGLE, 1, 4, 3, 8, 4096, 48)).row_fits_watermark
    standalone = reference_sizing(SizingInput(Algorithm.STANDALONE, 1, 4, 3, 8, 4096, 48))
    assert standalone.max_seq_len == 4095 and not standalone.row_fits_watermark


def test_dcp_pages_in_virtual_slots():
    s = reference_sizing(SizingInput(Algorithm.EAGLE, 64, 1, 3, 4, 4096, 48, dcp=8))
    assert s.allocator_page_size == 512


GRID = SIZING_GRID


@pytest.mark.sglang
def test_reference_agrees_with_installed_sglang_on_1000_plus_configs():
    assert len(GRID) >= 1000
    disagreements = []
    for algo, page, topk, steps, draft, ctx, dcp in GRID:
        x = SizingInput(algo, page, topk, steps, draft, ctx, 48, dcp)
        ref, sgl, diffs = compare(x)
        assert sgl is not None
        disagreements += [(x, d) for d in diffs]
    assert not disagreements, "\n".join(
        f"{x}: {d.field} specwatch={d.reference} sglang={d.sglang}" for x, d in disagreements[:20]
    )
    assert set(COMPARED_FIELDS) >= {"alloc_len_per_decode", "req_to_token_row_width", "req_to_token_bytes"}


@pytest.mark.parametrize(
    "version,page,row",
    [
        # req_to_token rows measured on the H200 (tiny, context 8192, topk 8, 3 steps, 8 draft tokens)
        ("0.5.13", 64, 10240),
        ("0.5.15", 256, 16384),
        ("0.5.16", 64, 10303),
        ("0.5.17", 256, 16639),
        (None, 64, 10303),
        ("0.5.17.post1", 64, 10303),
        ("0.5.15rc2", 64, 10240),
    ],
)
def test_the_row_rule_follows_the_sglang_release(version, page, row):
    x = SizingInput(Algorithm.EAGLE, page, 8, 3, 8, 8192, 8)
    assert reference_sizing(x, version).req_to_token_row_width == row


@pytest.mark.parametrize(
    "version,page,topk,draft,row",
    [
        # smoke's flashinfer rows measured on the H200 (tiny, context 8192, 3 steps)
        ("0.5.12", 64, 4, 8, 8204),
        ("0.5.12", 64, 1, 4, 8200),
        ("0.5.12", 1, 4, 8, 8204),
        ("0.5.13", 64, 4, 8, 9216),
        ("0.5.15", 64, 4, 8, 9216),
    ],
)
def test_0_5_12_rows_ignore_the_decode_reserve(version, page, topk, draft, row):
    x = SizingInput(Algorithm.EAGLE, page, topk, 3, draft, 8192, 1)
    sizing = reference_sizing(x, version)
    assert sizing.req_to_token_row_width == row
    if page > 1 and topk > 1:
        # the seed PR's invariant: 0.5.12's tree-on-paged-KV row cannot hold the context-limit
        # watermark (9216 slots); 0.5.13's can
        assert sizing.aligned_alloc_len_at_context_limit == 9216
        assert sizing.row_fits_watermark is (version != "0.5.12")


def test_release_parses_version_strings():
    assert release("0.5.17") == (0, 5, 17) and release("0.5.17.post1") == (0, 5, 17)
    assert release("0.5.15rc2") == (0, 5, 15) and release(None) is None and release("dev") is None
