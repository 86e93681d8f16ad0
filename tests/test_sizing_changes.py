"""The version table (``rules.sizing_changes``) names every release whose own sizing differs from the
release before it, and only those: each cached release's sizing functions (run from its files) are
compared with its predecessor's over the memory model's configurations, EAGLE family and DFLASH.

Skipped without the release cache (``scripts/fetch_sglang_sources.sh``); failed instead with
``SPECWATCH_REQUIRE_SGLANG_SRC=1`` (CI, ``.ci/run``).
"""

from __future__ import annotations

import os

import pytest

from records import SIZING_GRID
from specwatch.rules.memory_model import ModelAlgorithm, SizingInput, reference_sizing, release, sglang_sizing
from specwatch.rules.release_sizing import REQUIRE_ENV, SglangSource, cache_dir
from specwatch.rules.releases import releases
from specwatch.rules.sizing_changes import CHANGES, Change
from test_release_sizing import DFLASH_GRID

VERSIONS = [v for v in releases() if v >= "0.5.13"]
"""Releases with an extra-context-length function (0.5.12 sizes the row inline)."""
FIELDS = ("alloc_len_per_decode", "alloc_reserve_per_decode", "req_to_token_extra_context_len")


def _source(version: str) -> SglangSource:
    src = SglangSource.cached(version)
    if src is None:
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{REQUIRE_ENV}=1 but SGLang {version}'s source is not unpacked in {cache_dir()}")
        pytest.skip(f"no unpacked SGLang {version} in {cache_dir()}: run scripts/fetch_sglang_sources.sh")
    return src


def _sizing(version: str) -> dict[SizingInput, tuple]:
    """``version``'s own sizing fields and the model's decode watermark at the context limit, by config."""
    src = _source(version)
    out = {}
    # every third configuration: a stride of 3 keeps both dcp values (the grids' last axis)
    for algo, page, topk, steps, draft, ctx, dcp in SIZING_GRID[::3] + DFLASH_GRID[::3]:
        if algo is ModelAlgorithm.DFLASH and not src.knows("DFLASH"):
            continue
        x = SizingInput(algo, page, topk, steps, draft, ctx, 48, dcp)
        s = sglang_sizing(x, src)
        out[x] = (*(getattr(s, f) for f in FIELDS), reference_sizing(x, version).aligned_alloc_len_at_context_limit)
    return out


def _changed_in(version: str) -> set[Change]:
    return {c.change for c in CHANGES if c.since == release(version)}


@pytest.mark.parametrize("before,after", list(zip(VERSIONS, VERSIONS[1:])), ids=lambda v: v)
def test_a_release_changes_sizing_exactly_where_the_version_table_names_a_change(before, after):
    old, new = _sizing(before), _sizing(after)
    differ = [x for x in new if x in old and old[x] != new[x]]
    assert bool(differ) == bool(_changed_in(after) - {Change.dflash}), (after, _changed_in(after), differ[:5])


def test_0_5_19_changes_only_dcp_rows_and_dflash_watermarks_of_0_5_18():
    # sizing-on-allocator-page: rows and tree footprints on page x dcp (dcp > 1 only);
    # dflash-watermark-aligned: DFLASH's watermark rounded to a page (the model's field).
    assert _changed_in("0.5.19") == {Change.sizing_on_allocator_page, Change.dflash_watermark_aligned}
    old, new = _sizing("0.5.18"), _sizing("0.5.19")
    own = {x for x in new if old[x][:3] != new[x][:3]}
    watermark_only = {x for x in new if old[x][:3] == new[x][:3] and old[x][3] != new[x][3]}
    assert own and all(x.dcp > 1 for x in own)
    assert watermark_only and all(x.algorithm is ModelAlgorithm.DFLASH or x.dcp > 1 for x in watermark_only)
    assert any(x.algorithm is ModelAlgorithm.DFLASH and x.dcp == 1 for x in watermark_only)


def test_0_5_23_sizes_every_configuration_as_0_5_19_does():
    assert not any(_changed_in(v) for v in ("0.5.20", "0.5.21", "0.5.22", "0.5.23"))
    assert _sizing("0.5.19") == _sizing("0.5.23")
