import json
import warnings

import pytest

from records import case, record
from specwatch.core.errors import NewerSchemaError, SpecwatchInputError
from specwatch.core.record import SCHEMA_VERSION, CaseRecord, Status, parse_record
from specwatch.store.frame import records_frame
from specwatch.store.jsonl import (
    InvalidRecordWarning,
    TornLineWarning,
    append_record,
    finished_case_ids,
    import_records,
    load_records,
    read_records,
    result_files,
    results_path,
)


def test_round_trip():
    r = record()
    again = parse_record(json.loads(r.model_dump_json()))
    assert again == r


def test_newer_schema_is_a_clear_error():
    data = json.loads(record().model_dump_json())
    data["schema_version"] = SCHEMA_VERSION + 1
    with pytest.raises(NewerSchemaError) as e:
        parse_record(data, source="results/x.jsonl:3")
    assert str(e.value).startswith("results/x.jsonl:3: schema_version: record has schema_version")


def test_status_validation():
    with pytest.raises(ValueError, match="needs a reason"):
        record(status=Status.crashed)
    with pytest.raises(ValueError, match="does not match"):
        c = case()
        CaseRecord(**{**json.loads(record(c).model_dump_json()), "case_id": "000000000000"})
    data = json.loads(record().model_dump_json())
    data["status"] = "exploded"
    with pytest.raises(SpecwatchInputError, match="status"):
        parse_record(data)


def test_durable_append_and_torn_line(tmp_path):
    path = results_path(tmp_path, "m", "0.5.17", "smoke")
    a, b = record(case(topk=1, num_draft_tokens=4)), record(case(topk=8, num_draft_tokens=16), tps=50.0)
    append_record(path, a)
    with open(path, "ab") as f:  # a writer killed mid-record
        f.write(b.model_dump_json().encode()[:40])
    with pytest.warns(TornLineWarning, match=r"smoke.jsonl:2"):
        assert [r.case_id for r in read_records(path)] == [a.case_id]
    append_record(path, b)  # the next append must not merge with the torn bytes
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InvalidRecordWarning)  # the sealed torn line, now mid-file
        assert [r.case_id for r in read_records(path)] == [a.case_id, b.case_id]
    assert path.read_bytes().count(b"\n") == 3


def test_resume_ids_count_ok_and_skipped_only(tmp_path):
    path = tmp_path / "r.jsonl"
    ok, crashed, skipped = case(page_size=1), case(page_size=16), case(page_size=256)
    append_record(path, record(ok))
    append_record(path, record(crashed, status=Status.crashed, reason="SIGKILL"))
    append_record(path, record(skipped, status=Status.skipped, reason="x"))
    assert finished_case_ids(path) == {ok.case_id, skipped.case_id}


def test_frame_has_one_row_per_run(tmp_path):
    for v in ("0.5.16", "0.5.17"):
        append_record(results_path(tmp_path, "m", v, "smoke"), record(sglang_version=v))
    df = records_frame(load_records(result_files(tmp_path)))
    assert len(df) == 2 and set(df.sglang_version) == {"0.5.16", "0.5.17"}
    assert df.output_throughput.tolist() == [100.0, 100.0] and (df.page_size == 64).all()


def test_latest_rows_keep_the_newest_record_whole():
    """An ok run, then a crash of the same case: the crash is the latest, and none of the ok run's
    metrics may ride along with it (groupby().last() would fill them in)."""
    from datetime import timedelta

    from records import T0
    from specwatch.store.frame import latest_rows

    c = case()
    df = records_frame([record(c), record(c, status=Status.crashed, reason="boom", started_at=T0 + timedelta(hours=1))])
    (row,) = latest_rows(df, ["sglang_version", "case_id"]).to_dict("records")
    assert row["status"] == "crashed" and row["output_throughput"] != row["output_throughput"]  # NaN


def test_import_places_records_and_skips_repeats(tmp_path):
    src = tmp_path / "fetched.jsonl"
    a, b = record(case(page_size=1), sglang_version="0.5.16"), record(case(page_size=16))
    append_record(src, a)
    append_record(src, b)
    added = import_records([src, src], tmp_path / "results")
    assert sorted(n for n in added.values()) == [1, 1]
    assert [r.case_id for r in read_records(results_path(tmp_path / "results", "m", "0.5.16", "smoke"))] == [a.case_id]
    assert import_records([src], tmp_path / "results") == {}


def test_import_keeps_fault_runs_apart_from_clean_runs(tmp_path):
    src = tmp_path / "fetched.jsonl"
    clean, faulty = record(case(page_size=64)), record(case(page_size=64), fault="unaligned-watermark")
    append_record(src, clean)
    append_record(src, faulty)
    import_records([src], tmp_path / "results")
    base = results_path(tmp_path / "results", "m", clean.provenance.sglang_version, "smoke")
    assert [r.provenance.fault for r in read_records(base)] == [None]
    assert [r.provenance.fault for r in read_records(base.with_name("smoke+fault-unaligned-watermark.jsonl"))] == [
        "unaligned-watermark"
    ]


def test_a_lost_rendezvous_port_is_host_interference_and_runs_again(tmp_path):
    from specwatch.rules.crashlog import host_interference
    from specwatch.store.jsonl import recorded_case_ids

    lost = record(
        status=Status.crashed,
        reason="worker exited with code -9 before finishing this case: "
        "torch.distributed.DistNetworkError: The server socket has failed to listen on any local "
        "network address. port: 45377, useIpv6: false, code: -98, name: EADDRINUSE, message: "
        "address already in use",
    )
    assert "rendezvous" in host_interference(lost)
    path = results_path(tmp_path, "m", "0.5.17", "dcp")
    append_record(path, lost)
    assert recorded_case_ids(path) == set()


def test_a_cause_recorded_as_a_cpp_frame_is_read_again_from_the_log_tail():
    frame = "frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x9d (0x7f in libc10.so)"
    log = (
        '  File "eagle.py", line 47, in fill_bonus_tokens_func\n'
        "RuntimeError: Triton Error [CUDA]: an illegal memory access was encountered\n"
        "[rank0]: terminate called after throwing an instance of 'c10::Error'\n" + frame + "\n"
    )
    died = "worker exited with code -9 before finishing this case: "
    r = record(status=Status.crashed, reason=died + frame)
    r.log_tail = log
    assert (
        records_frame([r]).reason.item()
        == died + "RuntimeError: Triton Error [CUDA]: an illegal memory access was encountered"
    )
    assert r.reason == died + frame  # the record keeps its words
    r2 = record(status=Status.crashed, reason=died + "ValueError: boom")
    r2.log_tail = log
    assert records_frame([r2]).reason.item() == died + "ValueError: boom"  # a Python cause stands
