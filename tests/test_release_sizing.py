"""The memory model against each cached SGLang release's own sizing (run from its files), DFLASH
included; the version table against each release's source; the by-file path against the installed
SGLang imported whole."""

import itertools
import os
import re

import pytest

from records import SIZING_GRID
from specwatch.rules.memory_model import ModelAlgorithm, SizingInput, compare, installed_sizing, release, sglang_sizing
from specwatch.rules.release_sizing import REQUIRE_ENV, SglangSource
from specwatch.rules.releases import releases
from specwatch.rules.sizing_changes import CHANGES

A = ModelAlgorithm
GRID = SIZING_GRID
DFLASH_GRID = list(
    itertools.product(
        [A.DFLASH],
        [1, 2, 16, 64, 128, 256],  # page
        [1],  # topk (DFLASH drafts one block)
        [1, 3, 5, 7],  # steps
        [2, 4, 6, 8, 16, 32],  # draft tokens = block size
        [2048, 131072],
        [1, 2],
    )
)


def _source(version: str) -> SglangSource:
    src = SglangSource.cached(version)
    if src is None:
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(
                f"{REQUIRE_ENV}=1 but SGLang {version}'s source is not unpacked (scripts/fetch_sglang_sources.sh)"
            )
        pytest.skip(f"no unpacked SGLang {version}: run scripts/fetch_sglang_sources.sh")
    return src


def _disagreements(src, grid):
    out = []
    for algo, page, topk, steps, draft, ctx, dcp in grid:
        x = SizingInput(algo, page, topk, steps, draft, ctx, 48, dcp)
        _, sgl, diffs = compare(x, src)
        assert sgl is not None
        out += [(x, d) for d in diffs]
    return out


def _report(bad):
    return "\n".join(f"{x}: {d.field} specwatch={d.reference} sglang={d.sglang}" for x, d in bad[:20])


@pytest.mark.parametrize("version", [v for v in releases() if v >= "0.5.13"])
def test_the_model_agrees_with_each_release_sizing_on_1920_configs(version):
    src = _source(version)
    assert len(GRID) == 1920
    bad = _disagreements(src, GRID)
    assert not bad, _report(bad)


@pytest.mark.parametrize("version", [v for v in releases() if v >= "0.5.14"])
def test_the_model_agrees_with_each_release_on_500_plus_dflash_configs(version):
    src = _source(version)
    assert src.knows("DFLASH") and len(DFLASH_GRID) >= 500
    bad = _disagreements(src, DFLASH_GRID)
    assert not bad, _report(bad)


def test_dcp_rounds_0_5_23_rows_to_the_allocator_page_and_0_5_17_rows_to_the_server_page():
    x = SizingInput(A.EAGLE, 64, 1, 3, 4, 4096, 48, dcp=8)
    new, old = sglang_sizing(x, _source("0.5.23")), sglang_sizing(x, _source("0.5.17"))
    assert new.req_to_token_extra_context_len == 8 + 511 and old.req_to_token_extra_context_len == 8 + 63


@pytest.mark.parametrize("version", ["0.5.17", "0.5.19", "0.5.23"])
def test_dflash_row_at_page_1_misses_the_context_limit_watermark(version):
    # Finding: DFLASH's decode watermark is committed + 2 * block_size, but at page 1 the row headroom
    # is 4 + num_draft_tokens and DFLASH reserves nothing at admission (C - 1 tokens): the longest
    # request's last steps pass the row by block_size - 6 slots (draft 16: 10).
    from specwatch.rules.memory_model import reference_sizing

    s = reference_sizing(SizingInput(A.DFLASH, 1, 1, 3, 16, 4096, 48), version)
    assert s.decode_watermark_reserve == 32 and s.req_to_token_extra_context_len == 20
    assert s.aligned_alloc_len_at_context_limit - s.req_to_token_row_width == 10 and not s.row_fits_watermark
    assert reference_sizing(SizingInput(A.DFLASH, 64, 1, 3, 16, 4096, 48), version).row_fits_watermark


def test_dflash_watermark_is_rounded_to_a_page_from_0_5_19():
    from specwatch.rules.memory_model import reference_sizing

    x = SizingInput(A.DFLASH, 64, 1, 3, 16, 4096, 48)
    assert reference_sizing(x, "0.5.17").aligned_alloc_len_at_context_limit == 4094 + 32
    assert reference_sizing(x, "0.5.19").aligned_alloc_len_at_context_limit == 4160


@pytest.mark.parametrize("change", CHANGES, ids=lambda c: c.change.value)
def test_each_version_table_row_matches_every_cached_release(change):
    seen = 0
    for v in releases():
        src = SglangSource.cached(v)
        if src is None:
            continue
        srt = src.root / "sglang" / "srt"
        text = "\n".join((srt / f).read_text() for f in change.files if (srt / f).exists())
        assert bool(re.search(change.marker, text)) == (release(v) >= change.since), (v, change.change)
        seen += 1
    if not seen:
        pytest.skip("no cached release source")


@pytest.mark.sglang
def test_running_definitions_from_their_files_matches_the_installed_sglang_imported_whole():
    for algo, page, topk, steps, draft, ctx, dcp in GRID[::7] + DFLASH_GRID[::11]:
        x = SizingInput(algo, page, topk, steps, draft, ctx, 48, dcp)
        assert sglang_sizing(x) == installed_sizing(x), x
