"""Old records migrate, details are typed, one rule picks a case's latest record, and the Parquet
frame cache follows its JSONL."""

import json
import os
import warnings
from datetime import timedelta

import pytest

from records import T0, case, record
from specwatch.core.record import SCHEMA_VERSION, Details, HostLoad, Status, parse_record
from specwatch.store.jsonl import InvalidRecordWarning, append_record, load_records, result_files

LOST_PORT = (
    "worker exited with code -9 before finishing this case: torch.distributed.DistNetworkError: The "
    "server socket has failed to listen on any local network address. port: 45377, useIpv6: false, "
    "code: -98, name: EADDRINUSE, message: address already in use"
)


def test_a_version_1_record_migrates_and_reads_unchanged():
    d = json.loads(record().model_dump_json())
    d["schema_version"] = 1
    del d["provenance"]["run_id"]
    d["details"] = None
    r = parse_record(d)
    assert r.schema_version == SCHEMA_VERSION and r.provenance.run_id is None and r.details == Details()


def test_an_old_records_details_keep_every_key_and_gain_types():
    d = json.loads(record().model_dump_json())
    d["schema_version"] = 2
    d["details"] = {"host_load": {"before": 0.5, "after": None}, "output_digest": "ab", "an_unknown_key": [1]}
    r = parse_record(d)
    assert r.details.host_load == HostLoad(before=0.5) and r.details.output_digest == "ab"
    assert r.details["an_unknown_key"] == [1] and r.details.prompt_starts is None
    assert json.loads(r.model_dump_json())["details"] == d["details"]  # only the keys it holds


def test_every_committed_record_loads_without_quarantine():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "results"
    with warnings.catch_warnings():
        warnings.simplefilter("error", InvalidRecordWarning)
        recs = load_records(result_files(root), strict=True)
    assert len(recs) > 1000


def _interfered_later(c):
    measured = record(c, status=Status.crashed, reason="worker exited: ValueError: real", started_at=T0, finished_at=T0)
    lost = record(
        c,
        status=Status.crashed,
        reason=LOST_PORT,
        started_at=T0 + timedelta(hours=1),
        finished_at=T0 + timedelta(hours=1),
    )
    return measured, lost


def test_a_host_interference_record_is_latest_only_without_a_measured_one():
    from specwatch.store.frame import latest_rows, records_frame
    from specwatch.store.select import latest_by_case

    c = case()
    measured, lost = _interfered_later(c)
    assert latest_by_case([measured, lost])[c.case_id] is measured
    assert latest_by_case([lost])[c.case_id] is lost
    (row,) = latest_rows(records_frame([lost, measured]), ["case_id"]).to_dict("records")
    assert row["reason"] == measured.reason


def test_the_newest_by_finish_wins_and_ties_are_deterministic():
    from specwatch.store.frame import latest_rows, records_frame
    from specwatch.store.latest import latest_by_case

    c = case()
    early = record(c, tps=1.0, started_at=T0 + timedelta(minutes=5), finished_at=T0 + timedelta(minutes=6))
    late = record(c, tps=2.0, started_at=T0, finished_at=T0 + timedelta(minutes=9))  # started first, ended last
    for order in ([early, late], [late, early]):
        assert latest_by_case(order)[c.case_id] is late
        assert latest_rows(records_frame(order), ["case_id"]).output_throughput.item() == 2.0
    a, b = record(c, tps=3.0, run_id="b"), record(c, tps=4.0, run_id="a")  # same times: the run id decides
    assert latest_by_case([a, b])[c.case_id] is a and latest_by_case([b, a])[c.case_id] is a


def test_compare_does_not_call_a_case_failing_from_host_interference():
    from specwatch.analysis.compare import compare_records

    c = case()
    base = [record(c)]
    head_ok = record(c, started_at=T0, finished_at=T0)
    lost = record(
        c,
        status=Status.crashed,
        reason=LOST_PORT,
        started_at=T0 + timedelta(hours=1),
        finished_at=T0 + timedelta(hours=1),
    )
    from specwatch.analysis.compare import Verdict

    assert any(r.verdict is Verdict.now_failing for r in compare_records(base, [lost]))  # alone, it stands
    assert not any(r.verdict is Verdict.now_failing for r in compare_records(base, [head_ok, lost]))


def _frame_store(tmp_path):
    path = tmp_path / "m" / "sglang-0.5.17" / "smoke.jsonl"
    append_record(path, record(case(page_size=1), tps=10.0))
    return path


def test_the_cached_frame_equals_the_frame_built_from_records(tmp_path):
    import shutil
    from pathlib import Path

    from pandas.testing import assert_frame_equal

    from specwatch.store.frame import files_frame, records_frame

    root = tmp_path / "results"  # the caches are written beside a copy, not the checkout
    shutil.copytree(
        Path(__file__).resolve().parents[1] / "results", root, ignore=shutil.ignore_patterns("*.parquet", "*.lock")
    )
    files = result_files(root)
    norm = lambda df: df.astype(object).where(df.notna(), None)  # noqa: E731
    direct = records_frame(load_records(files))
    for _ in range(2):  # building the caches, then reading them
        cached = files_frame(files)
        assert_frame_equal(norm(direct), norm(cached[direct.columns.tolist()]))


def test_the_frame_cache_is_rebuilt_when_its_jsonl_changes(tmp_path):
    from specwatch.store.frame import files_frame
    from specwatch.store.frame_cache import cache_path

    path = _frame_store(tmp_path)
    assert files_frame([path]).output_throughput.tolist() == [10.0]
    assert cache_path(path).exists()
    append_record(path, record(case(page_size=16), tps=20.0))  # grows: size and mtime change
    assert files_frame([path]).output_throughput.tolist() == [10.0, 20.0]
    st = os.stat(path)
    text = path.read_text().replace('"value":20.0', '"value":30.0')  # same size, same mtime: the hash
    path.write_text(text)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(path).st_size == st.st_size
    assert files_frame([path]).output_throughput.tolist() == [10.0, 30.0]


def test_the_frame_cache_reports_quarantined_lines_again(tmp_path):
    from specwatch.store.frame import files_frame
    from specwatch.store.jsonl import Quarantine

    path = _frame_store(tmp_path)
    with open(path, "a") as f:
        f.write("[1, 2, 3]\n")
    for _ in range(2):
        q = Quarantine()
        with pytest.warns(InvalidRecordWarning, match=r"smoke.jsonl:2"):
            assert len(files_frame([path], quarantine=q)) == 1
        assert len(q) == 1


def test_a_read_only_store_is_read_without_a_cache(tmp_path, monkeypatch):
    import specwatch.store.frame_cache as fc
    from specwatch.store.frame import files_frame

    path = _frame_store(tmp_path)

    def refuse(*a, **k):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(fc.os, "replace", refuse)
    assert files_frame([path]).output_throughput.tolist() == [10.0]
    assert not fc.cache_path(path).exists() and list(path.parent.iterdir()) == [path]


def test_inside_one_pass_an_unchanged_file_is_hashed_once(tmp_path, monkeypatch):
    import hashlib

    from specwatch.store import frame_cache
    from specwatch.store.frame import files_frame

    path = _frame_store(tmp_path)
    files_frame([path])  # the cache built (and the row code's key hashed)
    hashed = []
    real = hashlib.sha256
    monkeypatch.setattr(frame_cache.hashlib, "sha256", lambda *a: hashed.append(1) or real(*a))
    files_frame([path])
    assert hashed == []  # the file's stamp is the one it had when hashed: not read again
    stamps = iter(range(100))
    monkeypatch.setattr(frame_cache, "stamp_of", lambda st: [next(stamps)])  # a stamp that never matches
    files_frame([path])
    with frame_cache.one_pass():
        for _ in range(3):
            assert files_frame([path]).output_throughput.tolist() == [10.0]
    assert len(hashed) == 2  # once outside, once for the three reads inside


def test_a_file_rewritten_under_its_old_size_and_mtime_is_hashed_and_rebuilt(tmp_path):
    import os

    from specwatch.store.frame import files_frame

    path = _frame_store(tmp_path)
    assert files_frame([path]).output_throughput.tolist() == [10.0]
    st = os.stat(path)
    text = path.read_text()
    assert "10.0" in text
    path.write_text(text.replace("10.0", "20.0", 1))  # same size; the change time moves
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(path).st_size == st.st_size and os.stat(path).st_mtime_ns == st.st_mtime_ns
    assert files_frame([path]).output_throughput.tolist() == [20.0]
