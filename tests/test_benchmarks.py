import inspect
import subprocess
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT))
from benchmarks import allocator_sim, eagle_tree, memory_model  # noqa: E402

CLASSES = [memory_model.MemoryModel, allocator_sim.AllocatorSimulation, eagle_tree.EagleTree]


@pytest.mark.parametrize("cls", CLASSES)
def test_params_and_names_agree_and_tracks_have_units(cls):
    assert len(cls.params) == len(cls.param_names) > 0
    assert all(isinstance(p, list) and p for p in cls.params)
    tracks = [n for n, f in inspect.getmembers(cls, inspect.isfunction) if n.startswith("track_")]
    assert tracks and all(getattr(cls, n).unit for n in tracks)


def test_memory_model_benchmark_values():
    b = memory_model.MemoryModel()
    b.setup(64, 8, 1)
    assert b.track_alloc_reserve_per_decode() == 2048


@pytest.mark.sglang
def test_allocator_benchmark_reports_planted_leak_and_skips():
    b = allocator_sim.AllocatorSimulation()
    b.setup(64, 8, "row-widen-revert")
    assert b.track_leaked_tokens() > 0
    with pytest.raises(NotImplementedError, match="topk > 1"):
        b.setup(64, 1, "row-widen-revert")


def test_eagle_tree_reads_committed_records(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECWATCH_SGLANG_VERSION", "0.5.17")
    monkeypatch.setattr(eagle_tree, "RECORDS", eagle_tree._records())
    b = eagle_tree.EagleTree()
    b.setup("triton", 64, 8, 1, "second-choice")
    assert b.track_accept_length() == 2.0 and b.track_leaked_tokens() == 0
    # the committed store also holds a --overlap-starts run of every case (timing contended by other
    # engines' starts, and one leak check read before the flush fix): trend points come from waves
    assert eagle_tree.RECORDS and all(v["leaked_tokens"] == 0 for v in eagle_tree.RECORDS.values())
    # one machine's own file only, when asv-import names the machine
    monkeypatch.setenv("SPECWATCH_MACHINE", "nvidia-h200-x1")
    assert eagle_tree._records().keys() == eagle_tree.RECORDS.keys()
    monkeypatch.setenv("SPECWATCH_MACHINE", "no-such-machine")
    assert eagle_tree._records() == {}
    # a case with no ok record (here: a store without records; the committed one keeps growing)
    monkeypatch.delenv("SPECWATCH_MACHINE")
    monkeypatch.setenv("SPECWATCH_RESULTS", str(tmp_path))
    monkeypatch.setattr(eagle_tree, "RECORDS", eagle_tree._records())
    with pytest.raises(NotImplementedError, match="no ok record"):
        eagle_tree.EagleTree().setup("triton", 64, 8, 1, "second-choice")


def test_eagle_tree_reads_the_cases_file_asv_import_names_instead_of_the_store(monkeypatch, tmp_path):
    from specwatch.present.asv_bridge import CASES_ENV, write_cases

    path = write_cases(tmp_path / "cases.json", {("fa3", 16, 2, 8, "perfect"): {"accept_length": 3.25}})
    monkeypatch.setenv(CASES_ENV, str(path))
    monkeypatch.setenv("SPECWATCH_RESULTS", str(tmp_path / "no-store"))
    monkeypatch.setattr(eagle_tree, "RECORDS", eagle_tree._records())
    b = eagle_tree.EagleTree()
    b.setup("fa3", 16, 2, 8, "perfect")
    assert b.track_accept_length() == 3.25


def test_asv_discovers_every_benchmark(tmp_path):
    res = subprocess.run(
        [sys.executable, "-m", "asv", "check", "-E", f"existing:{sys.executable}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "No problems found" in res.stdout


def test_asv_quick_dry_run_of_cpu_tier_benchmarks(tmp_path):
    """asv's own runner over one memory-model benchmark at two of its parameter combinations (asv
    starts one process per combination, about 1.5 s each, so the whole 48-point grid is left out;
    ``test_params_and_names_agree_and_tracks_have_units`` checks the grid, ``asv check`` above that
    every benchmark is discovered). asv's ``name(param, ...)`` selection picks page 64 and page 256
    at topk 8, dcp 1; the others show n/a. The allocator benchmarks import SGLang in every asv
    process, ~10 s each: they are exercised directly above instead."""
    env = {**__import__("os").environ, "HOME": str(tmp_path)}  # asv's machine file goes to $HOME
    subprocess.run(
        [sys.executable, "-m", "asv", "machine", "--yes", "--machine", "specwatch-ci"],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        timeout=120,
    )
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "asv",
            "run",
            "-E",
            f"existing:{sys.executable}",
            "--quick",
            "--dry-run",
            "--machine",
            "specwatch-ci",
            "--show-stderr",
            "--bench",
            r"MemoryModel.track_alloc_reserve_per_decode\((64|256), 8, 1\)",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = res.stdout
    assert res.returncode == 0, out + res.stderr
    assert "MemoryModel.track_alloc_reserve_per_decode" in out and " ok" in out
    rows = {tuple(line.split()) for line in out.splitlines()}
    assert ("64", "8", "2048", "n/a", "n/a") in rows and ("256", "8", "8192", "n/a", "n/a") in rows  # dcp 1
    assert ("16", "8", "n/a", "n/a", "n/a") in rows  # not selected, not run
    assert "failed" not in out.lower()


def test_the_store_scale_benchmark_is_discoverable_and_runs_on_a_tiny_store(monkeypatch, tmp_path):
    from benchmarks import store_scale

    monkeypatch.setenv("SPECWATCH_STORE_SCALES", "2")
    monkeypatch.setenv("SPECWATCH_STORE_DIR", str(tmp_path))
    b = store_scale.StoreScale()
    stores = b.setup_cache()
    assert list(stores) == [2] and (tmp_path / "x2").is_dir()
    tracks = [n for n, f in inspect.getmembers(store_scale.StoreScale, inspect.isfunction) if n.startswith("track_")]
    assert len(tracks) == 4 and all(getattr(store_scale.StoreScale, n).unit for n in tracks)
    assert b.track_cold_wall(stores, 2, "results") > 0
    assert any((tmp_path / "x2").rglob("*.jsonl.parquet"))  # the cold run built the caches
    assert b.track_warm_peak_rss(stores, 2, "compare") > 10


def test_the_store_scale_stores_carry_the_sources_a_a_pairs(tmp_path):
    from pathlib import Path

    from benchmarks import store_scale

    from records import case, record

    source = tmp_path / "src"
    (source / "m" / "sglang-0.5.17").mkdir(parents=True)
    (source / "m" / "sglang-0.5.17" / "smoke.jsonl").write_text(record(case()).model_dump_json() + "\n")
    (source / "noise-budgets.json").write_text('{"pairs": [], "budgets": {}}')
    root = Path(store_scale.make_stores(tmp_path / "out", source, [3])[3])
    assert (root / "noise-budgets.json").read_text() == (source / "noise-budgets.json").read_text()
    assert len((root / "m" / "sglang-0.5.17" / "smoke.jsonl").read_text().splitlines()) == 3
