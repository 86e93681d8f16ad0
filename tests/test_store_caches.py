"""The store's derived caches: each results file's change-point picks (``analysis.picks_cache``) and
the results computed from several files (``store.result_cache``: the detection floor, the
dashboard's change-point table) are taken from the cache while their files are unchanged, and
computed again once a file they were computed from changes."""

import json
from datetime import timedelta

import pytest

from records import T0, case, record
from specwatch.analysis.changepoints import COLUMNS, DASHBOARD_METRICS, changepoints, store_changepoints
from specwatch.core.record import Metric
from specwatch.store.frame import files_frame
from specwatch.store.jsonl import append_record, result_files

RELEASES = ["0.5.9", "0.5.10", "0.5.11", "0.5.12"]

NOISE = [[100.0, 101.0, 99.0], [100.5, 99.5, 100.0], [99.0, 100.0, 101.0]]


def _record(c, version: str, hour: int, samples: list[float]):
    r = record(c, sglang_version=version, started_at=T0 + timedelta(hours=hour), finished_at=T0 + timedelta(hours=hour))
    r.metrics = {
        "decode_throughput": Metric(value=sorted(samples)[1], unit="tokens/s", samples=samples, higher_is_better=True)
    }
    return r


def _history(root, c, drop: float) -> None:
    """One record of ``c`` per release, decode throughput ``drop`` lower from 0.5.11 on."""
    for i, v in enumerate(RELEASES):
        samples = [x * ((1 - drop) if i >= 2 else 1.0) for x in NOISE[i % 3]]
        append_record(root / "m" / f"sglang-{v}" / "smoke.jsonl", _record(c, v, i, samples))


def _fresh(root):
    """The change points computed from the records, no cache read."""
    return changepoints(files_frame(result_files(root), columns=COLUMNS), DASHBOARD_METRICS)


def test_the_picks_of_an_unchanged_file_come_from_its_cache(tmp_path, monkeypatch):
    import specwatch.analysis.changepoints as cp
    from specwatch.analysis.picks_cache import cache_path

    _history(tmp_path, case(page_size=64), 0.2)
    first = store_changepoints(result_files(tmp_path), DASHBOARD_METRICS)
    assert len(first) == 1 and all(cache_path(p).exists() for p in result_files(tmp_path))
    monkeypatch.setattr(cp, "_file_picks", lambda *a: (_ for _ in ()).throw(AssertionError("picked again")))
    assert store_changepoints(result_files(tmp_path), DASHBOARD_METRICS).equals(first)
    with pytest.raises(AssertionError, match="picked again"):  # other metrics: other picks
        store_changepoints(result_files(tmp_path), ["decode_throughput"])


def test_a_file_written_after_its_picks_were_cached_is_picked_again(tmp_path):
    c = case(page_size=64)
    _history(tmp_path, c, 0.2)
    assert store_changepoints(result_files(tmp_path), DASHBOARD_METRICS).change.tolist() == ["-20.0%"]
    # a newer run of the last release takes the step away: the cached picks of that file are stale
    v = RELEASES[-1]
    append_record(tmp_path / "m" / f"sglang-{v}" / "smoke.jsonl", _record(c, v, 9, NOISE[0]))
    got = store_changepoints(result_files(tmp_path), DASHBOARD_METRICS)
    assert got.equals(_fresh(tmp_path)) and got.change.tolist() == ["-20.0%", "+25.0%"]


def test_the_dashboards_change_point_table_is_computed_again_when_a_file_changes(tmp_path, monkeypatch):
    import specwatch.present.timing as timing
    from specwatch.store.result_cache import cache_path

    c = case(page_size=64)
    _history(tmp_path, c, 0.2)
    first = timing.store_steps(tmp_path)
    assert first.equals(_fresh(tmp_path)) and len(first) == 1
    assert cache_path(tmp_path, "changepoints").exists()
    real = timing.store_changepoints
    monkeypatch.setattr(timing, "store_changepoints", lambda *a: (_ for _ in ()).throw(AssertionError("computed")))
    assert timing.store_steps(tmp_path).equals(first)  # unchanged files: the cached table
    monkeypatch.setattr(timing, "store_changepoints", real)
    _history(tmp_path, case(page_size=16), 0.3)  # a second case steps too: every file written
    again = timing.store_steps(tmp_path)
    assert again.equals(_fresh(tmp_path)) and len(again) == 2


def _floor_store(root, spread: float) -> None:
    """Three A/A pairs (runs ka and kb) of 3 cases; pair k's largest change ``spread * (k + 1)``."""
    for k in range(3):
        for side in ("a", "b"):
            for i, change in enumerate((0.01, 0.01, spread * (k + 1))):
                tps = 100.0 * (1 + change if side == "b" else 1)
                r = record(case(input_len=100 + i), run_id=f"{k}{side}")
                r.metrics = {
                    "output_throughput": Metric(
                        value=tps, unit="tokens/s", samples=[tps - 1, tps, tps + 1], higher_is_better=True
                    )
                }
                append_record(root / "m" / "sglang-0.5.17" / "smoke.jsonl", r)
    pairs = [{"base": f"run={k}a", "head": f"run={k}b"} for k in range(3)]
    (root / "noise-budgets.json").write_text(json.dumps({"pairs": pairs, "budgets": {}}))


def _floor_of_records(root):
    from specwatch.analysis.floor import detection_floor
    from specwatch.store.select import select

    return detection_floor([(select(f"run={k}a", root), select(f"run={k}b", root)) for k in range(3)])


def test_the_floor_is_kept_while_its_files_are_unchanged_and_computed_again_after(tmp_path, monkeypatch):
    import specwatch.analysis.floor as floor
    from specwatch.store.result_cache import cache_path

    _floor_store(tmp_path, 0.04)
    first = floor.store_floor(tmp_path)
    assert first.floors == _floor_of_records(tmp_path).floors and cache_path(tmp_path, "detection-floor").exists()
    real = floor._pairs_floor
    monkeypatch.setattr(floor, "_pairs_floor", lambda *a: (_ for _ in ()).throw(AssertionError("computed")))
    assert floor.store_floor(tmp_path) == first
    monkeypatch.setattr(floor, "_pairs_floor", real)
    # the pairs' runs measured again with twice the spread: the records changed, so must the floor
    for p in result_files(tmp_path):
        p.unlink()
    _floor_store(tmp_path, 0.08)
    want = _floor_of_records(tmp_path).floors
    assert want != first.floors and floor.store_floor(tmp_path).floors == want


def test_a_new_budget_file_computes_the_floor_again(tmp_path):
    from specwatch.analysis.floor import store_floor

    _floor_store(tmp_path, 0.04)
    assert store_floor(tmp_path).pairs == 3
    data = json.loads((tmp_path / "noise-budgets.json").read_text())
    (tmp_path / "noise-budgets.json").write_text(json.dumps({**data, "pairs": data["pairs"][:2]}))
    assert store_floor(tmp_path).pairs == 2
