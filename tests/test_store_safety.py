"""The store is strict on the way in (safe names, whole-file import, one writer, failed writes
rolled back) and forgiving on the way out (bad lines quarantined, strict mode on request)."""

import errno
import json
import os
import subprocess
import sys
import warnings

import pytest

from records import case, record
from specwatch.core.errors import SpecwatchInputError
from specwatch.core.record import parse_record
from specwatch.store.jsonl import (
    InvalidRecordWarning,
    Quarantine,
    StoreWriteError,
    TornLineWarning,
    WriterLock,
    append_record,
    import_records,
    load_records,
    read_records,
    read_runs,
    result_files,
    results_path,
)

ESCAPES = ["/x/escape", "..", "../up", "a/b", ".hidden", "a..b", ""]


def _line(rec, **changes) -> str:
    d = json.loads(rec.model_dump_json())
    for dotted, value in changes.items():
        *head, last = dotted.split(".")
        target = d
        for k in head:
            target = target[k]
        target[last] = value
    return json.dumps(d)


@pytest.mark.parametrize("field", ["provenance.machine", "provenance.sglang_version", "provenance.fault", "suite"])
@pytest.mark.parametrize("value", ESCAPES)
def test_a_record_field_that_would_escape_the_store_is_refused_at_the_schema(field, value):
    with pytest.raises(SpecwatchInputError, match=field):
        parse_record(json.loads(_line(record(), **{field: value})))


@pytest.mark.parametrize(
    "kw",
    [
        dict(machine="/x/escape"),
        dict(machine=".."),
        dict(sglang_version="../../x"),
        dict(suite="../../etc"),
        dict(suite="a/b"),
        dict(fault="../x"),
    ],
)
def test_results_path_refuses_names_that_leave_the_root(tmp_path, kw):
    args = dict(machine="m", sglang_version="0.5.17", suite="smoke", fault=None)
    args.update(kw)
    with pytest.raises(SpecwatchInputError):
        results_path(tmp_path, **args)


def test_results_path_refuses_a_folder_linked_outside_the_root(tmp_path):
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "m").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    with pytest.raises(SpecwatchInputError, match="outside the results root"):
        results_path(tmp_path / "root", "m", "0.5.17", "smoke")


def test_import_of_a_record_naming_an_absolute_machine_writes_nothing(tmp_path):
    src = tmp_path / "fetched.jsonl"
    src.write_text(_line(record(), **{"provenance.machine": str(tmp_path / "escape")}) + "\n")
    with pytest.raises(SpecwatchInputError, match=r"fetched.jsonl:1: provenance.machine"):
        import_records([src], tmp_path / "results")
    assert not (tmp_path / "escape").exists() and not (tmp_path / "results").exists()


def test_import_validates_every_line_before_appending_any(tmp_path):
    src = tmp_path / "fetched.jsonl"
    good = [record(case(page_size=p)).model_dump_json() for p in (1, 16, 64)]
    src.write_text("\n".join(good + ['{"schema_version": 3, "suite": "smoke"}']) + "\n")
    with pytest.raises(SpecwatchInputError) as e:
        import_records([src], tmp_path / "results")
    assert str(e.value).startswith(f"{src}:4: ")
    assert "\n" not in str(e.value)
    assert result_files(tmp_path / "results") == []


BAD_LINES = {
    "not JSON": b"{this is not json}\n",
    "a JSON array": b"[1, 2, 3]\n",
    "a JSON int": b"42\n",
    "a JSON null": b"null\n",
    "nested too deeply": b"[" * 100_000 + b"]" * 100_000 + b"\n",
    "schema-invalid": b'{"schema_version": 3, "suite": "smoke"}\n',
}


@pytest.mark.parametrize("kind", list(BAD_LINES))
def test_a_bad_line_mid_file_is_quarantined_and_the_rest_loads(tmp_path, kind):
    path = tmp_path / "r.jsonl"
    a, b = record(case(page_size=1)), record(case(page_size=16))
    path.write_bytes(a.model_dump_json().encode() + b"\n" + BAD_LINES[kind] + b.model_dump_json().encode() + b"\n")
    q = Quarantine()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert [r.case_id for r in load_records([path], quarantine=q)] == [a.case_id, b.case_id]
    assert len(q) == 1 and q.entries[0].startswith(f"{path}:2: ")
    assert [w.category for w in seen] == [InvalidRecordWarning]  # mid-file: never "interrupted write"
    with pytest.raises(SpecwatchInputError, match=r"r.jsonl:2: "):
        load_records([path], strict=True)


def test_only_a_torn_last_line_is_an_interrupted_write(tmp_path):
    path = tmp_path / "r.jsonl"
    a = record()
    path.write_bytes(a.model_dump_json().encode() + b"\n" + a.model_dump_json().encode()[:40])
    with pytest.warns(TornLineWarning, match=r"r.jsonl:2: incomplete last line"):
        assert len(list(read_records(path))) == 1


def test_unreadable_files_are_one_warning_each(tmp_path):
    (tmp_path / "x.jsonl").mkdir()
    (tmp_path / "gone.jsonl").symlink_to(tmp_path / "missing")
    append_record(tmp_path / "ok.jsonl", record())
    q = Quarantine()
    with pytest.warns(InvalidRecordWarning):
        assert len(load_records(result_files(tmp_path), quarantine=q)) == 1
    assert sorted(e.split(":")[0] for e in q.entries) == [str(tmp_path / "gone.jsonl"), str(tmp_path / "x.jsonl")]
    with pytest.raises(SpecwatchInputError, match="cannot read"):
        load_records(result_files(tmp_path), strict=True)


def test_a_torn_runs_file_warns_and_keeps_its_good_summaries(tmp_path):
    from datetime import datetime, timezone

    from specwatch.core.record import RunSummary

    t = datetime(2026, 11, 30, tzinfo=timezone.utc)
    run = RunSummary(
        suites=["smoke"],
        faults=[None],
        parallel_starts=1,
        engine_groups=1,
        worker_starts=1,
        records={"ok": 1},
        wall_s=1,
        case_s=1,
        engine_start_s=1,
        stopped_early=False,
        machine="m",
        started_at=t,
        finished_at=t,
    )
    path = tmp_path / "runs.ndjson"
    path.write_text(run.model_dump_json() + "\n" + run.model_dump_json()[:30])
    with pytest.warns(TornLineWarning):
        assert read_runs(path) == [run]


def test_a_null_metric_value_reads_as_not_measured(tmp_path):
    import math

    from specwatch.store.frame import records_frame

    path = tmp_path / "r.jsonl"
    r = record()
    r.metrics["output_throughput"].value = float("nan")  # JSON writes NaN as null
    append_record(path, r)
    assert '"value":null' in path.read_text()
    (again,) = read_records(path, strict=True)
    assert math.isnan(again.metrics["output_throughput"].value)
    assert records_frame([again]).output_throughput.isna().all()


def test_a_second_writer_is_refused_naming_the_holder(tmp_path):
    path = tmp_path / "r.jsonl"
    code = (
        "import sys, time; from specwatch.store.jsonl import WriterLock\n"
        "with WriterLock(sys.argv[1]):\n    print('held', flush=True); time.sleep(30)\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(SpecwatchInputError, match=rf"another writer \(pid {holder.pid}\)"):
            with WriterLock(path):
                pass
    finally:
        holder.kill()
        holder.wait()
    with WriterLock(path):  # released with its holder
        append_record(path, record())


def test_import_into_a_file_another_writer_holds_is_refused(tmp_path):
    src = tmp_path / "fetched.jsonl"
    rec = record()
    append_record(src, rec)
    dest = results_path(tmp_path / "results", "m", "0.5.17", "smoke")
    with WriterLock(dest):
        with pytest.raises(SpecwatchInputError, match=r"another writer \(pid \d+\)"):
            import_records([src], tmp_path / "results")


def test_a_full_disk_is_one_line_naming_the_file_and_leaves_the_file_as_it_was(tmp_path, monkeypatch):
    path = tmp_path / "r.jsonl"
    append_record(path, record(case(page_size=1)))
    before = path.read_bytes()
    real_write = os.write

    def full(fd, data):
        real_write(fd, bytes(data[:10]))  # part of the record lands, then the disk is full
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(StoreWriteError) as e:
        append_record(path, record(case(page_size=16)))
    monkeypatch.undo()
    assert str(e.value) == f"{path}: cannot write: No space left on device"
    assert path.read_bytes() == before


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through read-only modes")
def test_a_read_only_store_is_one_line_naming_the_file(tmp_path):
    path = tmp_path / "v" / "r.jsonl"
    append_record(path, record(case(page_size=1)))
    before = path.read_bytes()
    path.chmod(0o444)
    path.parent.chmod(0o555)
    try:
        with pytest.raises(StoreWriteError, match=rf"{path}: cannot write: Permission denied"):
            append_record(path, record(case(page_size=16)))
        with pytest.raises(StoreWriteError, match="cannot write"):
            append_record(path.parent / "new.jsonl", record())
    finally:
        path.parent.chmod(0o755)
    assert path.read_bytes() == before


def test_a_read_only_filesystem_is_one_line_naming_the_file(tmp_path, monkeypatch):
    """As root, chmod does not stop a write: an EROFS from open stands in for a read-only mount."""
    path = tmp_path / "r.jsonl"
    append_record(path, record())
    before = path.read_bytes()
    real_open = os.open

    def read_only(p, flags, *a):
        if flags & (os.O_WRONLY | os.O_RDWR):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))
        return real_open(p, flags, *a)

    monkeypatch.setattr(os, "open", read_only)
    with pytest.raises(StoreWriteError, match=rf"{path}: cannot write: Read-only file system"):
        append_record(path, record(case(page_size=16)))
    monkeypatch.undo()
    assert path.read_bytes() == before


def test_a_second_runner_on_the_same_results_file_is_refused_before_writing(tmp_path, monkeypatch):
    from specwatch.run.runner import RunOptions, run_suite
    from specwatch.suite import load_suite

    monkeypatch.setenv("SPECWATCH_MACHINE", "m")
    monkeypatch.setenv("SPECWATCH_SGLANG_VERSION", "0.5.17")
    suite_file = tmp_path / "s.toml"
    suite_file.write_text(
        '[suite]\nname = "harness"\nrepeats = 1\n[[matrix]]\nattention_backend = ["triton"]\n'
        "page_size = [1]\ntopk = [1]\nnum_draft_tokens = [2]\nbatch_size = [1]\n"
    )
    out = results_path(tmp_path / "results", "m", "0.5.17", "harness")
    with WriterLock(out):  # the other runner
        with pytest.raises(SpecwatchInputError, match=rf"another writer \(pid {os.getpid()}\)"):
            run_suite(load_suite(suite_file), tmp_path / "results", RunOptions(gpus=1, worker_module="fake_worker"))
    assert not out.exists()
