"""Change points over SGLang releases: asv's step detector on each case's history finds a planted
step between the two releases it was planted between, and nothing in a flat history."""

from datetime import timedelta

from records import T0, case, record
from specwatch.analysis.changepoints import COLUMNS, changepoints, release_steps
from specwatch.core.record import Metric
from specwatch.store.frame import files_frame
from specwatch.store.jsonl import append_record, result_files

RELEASES = ["0.5.9", "0.5.10", "0.5.11", "0.5.12", "0.5.13", "0.5.14"]
"""Out of string order on purpose: 0.5.10 sorts before 0.5.9 as text."""


def _history(tmp_path, c, values_of):
    for i, v in enumerate(RELEASES):
        r = record(c, sglang_version=v, started_at=T0 + timedelta(hours=i), finished_at=T0 + timedelta(hours=i))
        samples = values_of(i)
        r.metrics = {
            "decode_throughput": Metric(
                value=sorted(samples)[1], unit="tokens/s", samples=samples, higher_is_better=True
            )
        }
        append_record(tmp_path / "m" / f"sglang-{v}" / "smoke.jsonl", r)


def test_a_planted_step_is_found_between_the_releases_it_was_planted_between(tmp_path):
    stepped, flat = case(page_size=64), case(page_size=1)
    noise = [[100.0, 101.0, 99.0], [100.5, 99.5, 100.0], [99.0, 100.0, 101.0]]
    # decode throughput drops 20% from 0.5.12 on (the 4th release in version order)
    _history(tmp_path, stepped, lambda i: [x * (0.8 if i >= 3 else 1.0) for x in noise[i % 3]])
    _history(tmp_path, flat, lambda i: noise[i % 3])
    df = files_frame(result_files(tmp_path), columns=COLUMNS)
    t = changepoints(df)
    assert len(t) == 1
    (row,) = t.to_dict("records")
    assert (row["case_id"], row["metric"], row["from"], row["to"]) == (
        stepped.case_id,
        "decode_throughput",
        "0.5.11",
        "0.5.12",
    )
    assert row["change"] == "-20.0%"


def test_a_step_below_the_threshold_is_not_reported():
    history = [(v, [100.0, 100.2, 99.8]) for v in RELEASES[:3]] + [(v, [97.0, 97.2, 96.8]) for v in RELEASES[3:]]
    assert [s.release for s in release_steps(history, threshold=0.01)] == ["0.5.12"]
    assert release_steps(history, threshold=0.05) == []


def _two_cases(tmp_path):
    stepped, other = case(page_size=64), case(page_size=16)
    noise = [[100.0, 101.0, 99.0], [100.5, 99.5, 100.0], [99.0, 100.0, 101.0]]
    for c in (stepped, other):  # the same history twice: two cases, equal samples
        _history(tmp_path, c, lambda i: [x * (0.8 if i >= 3 else 1.0) for x in noise[i % 3]])
    return stepped, other


def test_read_file_by_file_the_change_points_are_those_of_the_whole_frame(tmp_path):
    from specwatch.analysis.changepoints import store_changepoints

    _two_cases(tmp_path)
    whole = changepoints(files_frame(result_files(tmp_path), columns=COLUMNS))
    assert len(whole) == 2
    assert store_changepoints(result_files(tmp_path)).equals(whole)


def test_a_history_seen_before_is_not_fitted_again(tmp_path, monkeypatch):
    import specwatch.analysis.changepoints as cp

    stepped, other = _two_cases(tmp_path)
    fitted = []
    real = cp.release_steps
    monkeypatch.setattr(cp, "release_steps", lambda h, t: fitted.append(h) or real(h, t))
    t = changepoints(files_frame(result_files(tmp_path), columns=COLUMNS))
    assert sorted(t.case_id) == sorted([stepped.case_id, other.case_id]) and len(fitted) == 1


def test_a_file_of_many_records_has_its_picked_cells_taken_from_its_cache_alone(tmp_path, monkeypatch):
    import specwatch.analysis.changepoints as cp
    from specwatch.core.record import Status
    from specwatch.store.frame_cache import cache_path, cached_cells

    noise = [[100.0, 101.0, 99.0], [100.5, 99.5, 100.0], [99.0, 100.0, 101.0]]
    for c in (case(page_size=64), case(page_size=16), case(page_size=1)):  # one file per release, 3 cases
        _history(tmp_path, c, lambda i: [x * (0.8 if i >= 3 else 1.0) for x in noise[i % 3]])
    for v in RELEASES:  # an older record and a failed one in each file, out of order
        old = record(case(page_size=64), sglang_version=v, started_at=T0 - timedelta(days=1))
        old.metrics = {"decode_throughput": Metric(value=1.0, unit="tokens/s", samples=[1.0], higher_is_better=True)}
        append_record(tmp_path / "m" / f"sglang-{v}" / "smoke.jsonl", old)
        append_record(
            tmp_path / "m" / f"sglang-{v}" / "smoke.jsonl", record(case(page_size=1), status=Status.failed, reason="x")
        )
    whole = cp.changepoints(files_frame(result_files(tmp_path), columns=COLUMNS))
    assert len(whole) == 3
    monkeypatch.setattr(cp, "picked_rows", lambda *a: (_ for _ in ()).throw(AssertionError("whole column read")))
    monkeypatch.setattr("specwatch.store.frame_cache.CELL_BATCH", 2)  # picks spread over batches
    assert cp.store_changepoints(result_files(tmp_path)).equals(whole)
    path = result_files(tmp_path)[0]
    assert cache_path(path).exists() and cached_cells(path, "_compare", [0], expect_rows=999) is None
