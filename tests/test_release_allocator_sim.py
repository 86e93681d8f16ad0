"""The allocator simulation on a release's own classes: the installed SGLang (0.5.17) and 0.5.23 from
its unpacked source (``rules.release_classes``), each against the versioned memory model.

The 0.5.23 tests skip without the release cache (``scripts/fetch_sglang_sources.sh``) and fail
instead with ``SPECWATCH_REQUIRE_SGLANG_SRC=1``, as CI (``.ci/run``) sets it after fetching the
sources; the installed-SGLang tests carry the ``sglang`` mark (``SPECWATCH_REQUIRE_SGLANG=1``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from specwatch.core.errors import SpecwatchInputError
from specwatch.cpu.allocator_sim import AcceptPattern, SimConfig, simulate
from specwatch.rules.memory_model import ModelAlgorithm, SizingInput, reference_sizing
from specwatch.rules.release_sizing import REQUIRE_ENV, SglangSource, cache_dir

pytestmark = pytest.mark.sglang  # the installed SGLang brings torch and is the other side of each comparison

A = ModelAlgorithm
SRC = Path(__file__).resolve().parents[1] / "src"
INSTALLED = None
"""``SimConfig.release`` of the installed SGLang."""


def _cached(version: str) -> str:
    if SglangSource.cached(version) is None:
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{REQUIRE_ENV}=1 but SGLang {version}'s source is not unpacked in {cache_dir()}")
        pytest.skip(f"no unpacked SGLang {version} in {cache_dir()}: run scripts/fetch_sglang_sources.sh")
    return version


def _release(param):
    return INSTALLED if param == "installed" else _cached(param)


def _version(release) -> str:
    return release or SglangSource.installed().version


CONFIGS = {
    # name: algorithm, topk, steps, draft (DFLASH: draft = block size)
    "eagle-chain": (A.EAGLE, 1, 3, 4),
    "eagle-tree": (A.EAGLE, 8, 3, 16),
    "dflash": (A.DFLASH, 1, 3, 16),
}


def _sim(release, name, page, **kw) -> tuple:
    algo, topk, steps, draft = CONFIGS[name]
    cfg = SimConfig(page, topk, steps, draft, algorithm=algo, accept=AcceptPattern.one, release=release, **kw)
    x = SizingInput(algo, page, topk, steps, draft, cfg.context_len, cfg.num_requests, cfg.dcp)
    return simulate(cfg), reference_sizing(x, _version(release))


@pytest.mark.parametrize("release", ["installed", "0.5.23"])
@pytest.mark.parametrize("page", [1, 64, 256])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_the_simulation_reaches_the_row_and_watermark_the_versioned_model_predicts(release, page, name):
    release = _release(release)
    res, model = _sim(release, name, page)
    assert res.sglang_classes["version"] == _version(release)
    assert res.row_width == model.req_to_token_row_width
    assert res.reserve == model.decode_watermark_reserve
    # accept=one: the longest admitted request's last decode step starts at max_seq_len - 1
    assert res.max_watermark == model.aligned_alloc_len_at_context_limit
    overflow = max((v.watermark - v.row_width for v in res.row_violations), default=0)
    assert overflow == max(0, model.aligned_alloc_len_at_context_limit - model.req_to_token_row_width)
    assert res.clean == model.row_fits_watermark, res.as_dict()
    assert res.req_slots_leaked == 0 and res.double_freed_pages == 0


@pytest.mark.parametrize("release", ["installed", "0.5.23"])
def test_page_1_rows_overflow_on_both_releases_by_the_measured_slots(release):
    # EAGLE topk 8, steps 3, draft 16: 3 slots past the row (admission reserve 24 < watermark
    # reserve 48 - headroom 20); DFLASH block 16: 10 (reserve 32, headroom 20, nothing reserved at
    # admission). Each overflowing slot is written past the row and never freed: 4 requests leak 4x.
    release = _release(release)
    for name, over in (("eagle-tree", 3), ("dflash", 10)):
        res, _ = _sim(release, name, 1)
        assert max(v.watermark - v.row_width for v in res.row_violations) == over
        assert res.leaked_tokens == 4 * over and res.out_of_bounds_tokens == over  # the last row's tail
    chain, _ = _sim(release, "eagle-chain", 1)
    assert chain.clean


@pytest.mark.parametrize("release", ["installed", "0.5.23"])
@pytest.mark.parametrize("page", [1, 64, 256])
def test_dflash_reserves_two_blocks_per_decode(release, page):
    release = _release(release)
    for block in (6, 16):
        cfg = SimConfig(page, 1, 3, block, algorithm=A.DFLASH, accept=AcceptPattern.random, release=release)
        res = simulate(cfg)
        assert res.reserve == 2 * block
        assert res.leaked_pages == 0 or page == 1  # page 1, block 16: the row overflow above


def test_dflash_watermark_is_page_aligned_on_0_5_23_and_unaligned_on_0_5_17():
    new = {p: _sim(_cached("0.5.23"), "dflash", p)[0] for p in (64, 256)}
    old = {p: _sim(INSTALLED, "dflash", p)[0] for p in (64, 256)}
    assert {p: r.max_watermark for p, r in new.items()} == {64: 576, 256: 768}  # ceil(510 + 32)
    assert {p: r.max_watermark for p, r in old.items()} == {64: 542, 256: 542}  # 510 + 32
    assert all(r.clean for r in [*new.values(), *old.values()])


def test_the_result_names_the_release_whose_classes_ran():
    installed, _ = _sim(INSTALLED, "eagle-tree", 64)
    new, _ = _sim(_cached("0.5.23"), "eagle-tree", 64)
    assert installed.sglang_classes["origin"] == "installed" and installed.sglang_classes["version"] == "0.5.17"
    assert Path(installed.sglang_classes["path"]) == SglangSource.installed().root / "sglang"
    assert new.sglang_classes["origin"] == "cached" and new.sglang_classes["version"] == "0.5.23"
    assert Path(new.sglang_classes["path"]) == (cache_dir() / "0.5.23" / "sglang").resolve()


def test_0_5_23s_alloc_extend_runs_on_the_cpu_itself_and_0_5_17s_needs_its_host_helper():
    # 0.5.22 on: PagedTokenToKVPoolAllocator.alloc_extend has a torch path (use_triton_kernels off);
    # up to 0.5.21 it always launches Triton, so the simulation calls alloc_extend_naive in its place.
    assert _sim(_cached("0.5.23"), "eagle-tree", 64)[0].sglang_classes["alloc_extend"] == "release"
    assert _sim(_cached("0.5.22"), "eagle-tree", 64)[0].sglang_classes["alloc_extend"] == "release"
    assert _sim(_cached("0.5.21"), "eagle-tree", 64)[0].sglang_classes["alloc_extend"] == "host-naive"
    assert _sim(INSTALLED, "eagle-tree", 64)[0].sglang_classes["alloc_extend"] == "host-naive"


def test_0_5_23s_pool_hands_rows_out_from_the_tail_and_0_5_17s_from_the_head():
    # ReqToTokenPool.alloc: up to 0.5.17 free_slots[:n], from 0.5.18 free_slots[-n:] (alloc_rows).
    # The request whose row is last is the one whose page-1 overflow runs past the tensor; the
    # counts stay the same (test above).
    assert _sim(INSTALLED, "dflash", 1)[0].request_rows == [1, 2, 3, 4]
    assert _sim(_cached("0.5.18"), "dflash", 1)[0].request_rows == [4, 3, 2, 1]
    assert _sim(_cached("0.5.23"), "dflash", 1)[0].request_rows == [4, 3, 2, 1]


@pytest.mark.parametrize("page", [1, 64, 256])
def test_dflash_rows_of_0_5_15_overflow_at_every_page(page):
    # 0.5.13-0.5.15 widen a paged row past 4 + num_draft_tokens for topk > 1 only (row-page-slack
    # from 0.5.16): DFLASH (topk 1) rows hold C + 20 at block 16, its watermark reaches C - 2 + 32.
    res, model = _sim(_cached("0.5.15"), "dflash", page)
    assert res.row_width == 512 + 20 == model.req_to_token_row_width and not model.row_fits_watermark
    assert max(v.watermark - v.row_width for v in res.row_violations) == 10 and res.out_of_bounds_tokens == 10
    assert _sim(_cached("0.5.16"), "dflash", page)[0].clean == (page > 1)


def test_the_dcp_row_that_overflows_on_0_5_17_holds_the_watermark_on_0_5_23():
    # 0.5.17 rounds the watermark to the allocator page (64 x 8) and the row to the server page;
    # 0.5.19 on size the row on the allocator page too (sizing_changes: sizing-on-allocator-page).
    cfg = SimConfig(64, 1, 3, 4, dcp=8, accept=AcceptPattern.one)
    old, new = simulate(cfg), simulate(replace(cfg, release=_cached("0.5.23")))
    assert old.row_violations and old.max_watermark == 1024 > old.row_width == 512 + 8 + 63
    assert new.clean and new.max_watermark == 1024 <= new.row_width == 512 + 8 + 511
    oldest = simulate(replace(cfg, release=_cached("0.5.15")))  # rows not widened at topk 1
    assert oldest.row_violations and oldest.row_width == 512 + 8


@pytest.mark.parametrize("accept", list(AcceptPattern))
def test_0_5_17_from_its_source_simulates_exactly_as_the_installed_0_5_17(accept):
    for page, name in ((1, "eagle-tree"), (64, "eagle-tree"), (256, "dflash")):
        algo, topk, steps, draft = CONFIGS[name]
        cfg = SimConfig(page, topk, steps, draft, algorithm=algo, accept=accept, seed=3)
        installed, cached = simulate(cfg), simulate(replace(cfg, release=_cached("0.5.17")))
        a, b = installed.as_dict(), cached.as_dict()
        assert a.pop("sglang_classes")["origin"] == "installed" and b.pop("sglang_classes")["origin"] == "cached"
        a["config"].pop("release"), b["config"].pop("release")
        assert a == b


def test_a_release_without_source_is_one_input_error_naming_the_option(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECWATCH_SGLANG_SRC", str(tmp_path))
    with pytest.raises(SpecwatchInputError, match="--release: SGLang 0.5.23's source is not unpacked"):
        simulate(SimConfig(64, 1, 3, 4, release="0.5.23"))


def _cli(*args, **env):
    environ = {**os.environ, "PYTHONPATH": str(SRC), **env}
    cmd = [sys.executable, "-m", "specwatch.cli", "model", "simulate", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=environ, timeout=300)


def test_simulate_without_the_release_source_says_so_in_one_line_exit_2(tmp_path):
    res = _cli("--release", "0.5.23", SPECWATCH_SGLANG_SRC=str(tmp_path))
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "--release" in res.stderr and "0.5.23" in res.stderr


def test_simulate_json_names_the_release_classes():
    """In this process, where the release's classes are already loaded (a child process would spend
    ~8 s importing torch and them again for each command)."""
    from typer.testing import CliRunner

    from specwatch.cli import app

    _cached("0.5.23")

    def simulate_cli(*args):
        return CliRunner().invoke(app, ["model", "simulate", "--release", "0.5.23", *args])

    res = simulate_cli("--page", "1", "--topk", "1", "--draft", "16", "--algorithm", "DFLASH")
    assert res.exit_code == 1 and "SGLang 0.5.23's classes (cached:" in " ".join(res.stdout.split()), res.output
    res = simulate_cli("--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["sglang_classes"]["version"] == "0.5.23" and out["clean"]
