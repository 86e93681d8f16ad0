"""The store's fast paths read exactly what the exact paths read: records, selections, health, roofline."""

import json
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from records import case, record
from specwatch.core.record import SCHEMA_VERSION, Status, parse_record
from specwatch.store.jsonl import (
    InvalidRecordWarning,
    Quarantine,
    append_record,
    fast_record,
    read_records,
    result_files,
    results_path,
)
from specwatch.store.select import file_fields, select, selected_files

RESULTS = Path(__file__).resolve().parents[1] / "results"


def test_the_fast_path_reads_every_committed_record_as_parse_record_does():
    lines = [x for f in result_files(RESULTS) for x in f.read_bytes().splitlines() if x.strip()]
    assert len(lines) > 1000
    for line in lines:
        exact, fast = parse_record(json.loads(line)), fast_record(line)
        assert fast == exact and fast.model_fields_set == exact.model_fields_set
        assert fast.model_dump_json() == exact.model_dump_json()


def _line(**change) -> dict:
    data = json.loads(record().model_dump_json())
    data.update(change)
    return data


@pytest.mark.parametrize(
    "data, message",
    [
        ({k: v for k, v in _line().items() if k != "schema_version"}, "record has no integer schema_version"),
        (_line(schema_version=True), "record has no integer schema_version"),
        (_line(schema_version=float(SCHEMA_VERSION)), "record has no integer schema_version"),
        (_line(schema_version=SCHEMA_VERSION + 1), "upgrade specwatch"),
    ],
)
def test_a_line_the_fast_path_refuses_is_judged_by_parse_record(tmp_path, data, message):
    path = tmp_path / "x.jsonl"
    path.write_text(json.dumps(data) + "\n")
    q = Quarantine()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InvalidRecordWarning)
        assert list(read_records(path, quarantine=q)) == []
    assert len(q) == 1 and message in q.entries[0] and q.entries[0].startswith(f"{path}:1")


def test_an_old_record_with_null_details_is_migrated_as_before(tmp_path):
    path = tmp_path / "x.jsonl"
    data = _line(schema_version=1, details=None)
    del data["provenance"]["run_id"]
    path.write_text(json.dumps(data) + "\n")
    (rec,) = read_records(path)
    assert rec == parse_record(data) and rec.schema_version == SCHEMA_VERSION


def _store(tmp_path: Path) -> Path:
    root = tmp_path / "results"
    for version in ("0.5.16", "0.5.17"):
        r = record(sglang_version=version)
        append_record(results_path(root, "m", version, "smoke"), r)
        append_record(results_path(root, "m", version, "smoke", fault="f", probe=True), r.model_copy())
    return root


def test_a_selection_reads_only_the_files_its_terms_can_match(tmp_path):
    root = _store(tmp_path)
    other = results_path(root, "m", "0.5.16", "smoke")
    other.write_text("not json\n")  # read, it would warn
    with warnings.catch_warnings():
        warnings.simplefilter("error", InvalidRecordWarning)
        recs = select("sglang_version=0.5.17,suite=smoke", root)
    assert [r.provenance.sglang_version for r in recs] == ["0.5.17"]
    assert selected_files(root, [("sglang_version", False, "0.5.17")]) == [results_path(root, "m", "0.5.17", "smoke")]
    faults = selected_files(root, [("fault", False, "f")])
    assert [p.name for p in faults] == ["smoke+fault-f.jsonl"] * 2
    assert len(selected_files(root, [("sglang_version", True, "0.5.17"), ("fault", True, "none")])) == 1


def test_a_file_outside_the_layout_or_with_an_ambiguous_name_is_read_whole(tmp_path):
    root = _store(tmp_path)
    stray = root / "copied.jsonl"
    stray.write_text(record(sglang_version="0.5.17").model_dump_json() + "\n")
    odd = root / "m" / "sglang-0.5.17" / "a+b.jsonl"
    odd.write_text(stray.read_text())
    assert file_fields(stray, root) is None and file_fields(odd, root) is None
    assert {stray, odd} <= set(selected_files(root, [("suite", False, "nothing")]))
    assert len(select("sglang_version=0.5.17", root)) == 3


def test_the_verdicts_health_from_the_frame_is_that_of_the_records():
    from specwatch.analysis.verdict import frame_health, suite_health
    from specwatch.store.frame import files_frame
    from specwatch.store.jsonl import load_records

    records = [r for r in load_records(result_files(RESULTS)) if r.provenance.fault is None and r.provenance.probe]
    df = files_frame(result_files(RESULTS), cache=False)
    df = df[df.fault.isna() & (df.probe == True)]  # noqa: E712
    pairs = {(r.provenance.sglang_version, r.suite) for r in records}
    assert len(pairs) > 10
    for version, suite in sorted(pairs):
        recs = [r for r in records if r.provenance.sglang_version == version and r.suite == suite]
        rows = df[(df.sglang_version == version) & (df.suite == suite)]
        assert frame_health(suite, rows) == suite_health(suite, recs), (version, suite)
    assert any(frame_health(s, df[df.suite == s]).failing_checks for s in set(df.suite))


def test_the_roofline_from_the_frame_is_that_of_the_records():
    from specwatch.analysis.roofline import roofline_frame, roofline_rows
    from specwatch.store.frame import records_frame

    recs = [record(case(model="8b", topk=k), tps=50.0 + k) for k in (1, 2, 4)]
    recs.append(record(case(model="8b", batch_size=4)))
    recs.append(record(case(model="8b", topk=8), status=Status.crashed, reason="boom"))
    for r in recs:
        if r.status is Status.ok:
            r.metrics["accept_length"] = r.metrics["output_throughput"].model_copy(update={"value": 2.5})
    a, b = roofline_frame(recs), roofline_rows(records_frame(recs))
    assert len(a) == 3 and a.equals(b)


@pytest.mark.parametrize(
    "base, head",
    [
        ("sglang_version=0.5.16,suite=tree-page", "sglang_version=0.5.17,suite=tree-page"),
        ("sglang_version=0.5.17,suite=smoke", "sglang_version=0.5.20,suite=smoke,overlap=on"),
        ("suite=smoke,sglang_version=0.5.17,run=-2", "suite=smoke,sglang_version=0.5.17,run=-1"),
        ("suite=faults", "suite=faults,fault!=none"),
        ("suite=model-8b,probe=off", "suite=model-8b"),
    ],
)
def test_compare_on_frame_rows_is_compare_on_records(base, head):
    from specwatch.analysis.compare import compare_frames, compare_records
    from specwatch.store.select_frame import select_rows

    budgets = json.loads((RESULTS / "noise-budgets.json").read_text())["budgets"]
    b, h = select(base, RESULTS), select(head, RESULTS)
    rows_b, rows_h = select_rows(base, RESULTS), select_rows(head, RESULTS)
    assert list(rows_b.case_id) == [r.case_id for r in b] and list(rows_h.case_id) == [r.case_id for r in h]
    expected = compare_records(b, h, budgets=budgets)
    assert len(expected) > 10 and compare_frames(rows_b, rows_h, budgets=budgets) == expected


def test_an_unknown_selection_field_is_refused_by_the_frame_selection_too():
    from specwatch.core.errors import SpecwatchInputError
    from specwatch.store.select_frame import select_rows

    with pytest.raises(SpecwatchInputError, match="FIELD=VALUE"):
        select_rows("colour=blue", RESULTS)


def test_the_fast_path_takes_lines_written_with_spaces_too(monkeypatch):
    import specwatch.store.jsonl as jsonl

    line = json.dumps(json.loads(record().model_dump_json())).encode()  # ", " and ": " separators
    assert fast_record(line) == parse_record(json.loads(line))
    monkeypatch.setattr(jsonl, "parse_record", None)  # the exact path would now fail
    assert jsonl.fast_record(line).case_id == record().case_id


def test_the_scale_script_prints_every_scenario_with_its_time_and_memory():
    """``scripts/store_scale.py`` (the store's table: wall time and memory per scenario) on a 1-times store."""
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run(
        [sys.executable, str(root / "scripts" / "store_scale.py"), "--copies", "1", "--repeats", "1"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=root,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [line for line in out.stdout.splitlines() if re.match(r"\| (dashboard|`specwatch results`)", line)]
    assert len(rows) == 7 and all(re.search(r"\| [\d.]+ \| [\d.]+ \|$", r) for r in rows), out.stdout
