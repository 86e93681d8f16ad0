"""Speedup over plain decoding: suites that opt in plan plain twins, the runner records them, and
spec records carry ``speedup`` and the break-even acceptance length over their twin."""

import hashlib
import os
from pathlib import Path

import pytest

from conftest import SUITES, harness_suite
from specwatch.core.case import Algorithm, Backend, Case
from specwatch.core.errors import SpecwatchInputError
from specwatch.core.record import Status
from specwatch.run.runner import RunOptions, engine_groups, run_suite
from specwatch.store.jsonl import read_records
from specwatch.store.latest import record_id
from specwatch.store.twins import BREAK_EVEN, SPEEDUP
from specwatch.suite import load_suite, parse_where, selected

HERE = os.path.dirname(__file__)

SHIPPED_PLAN_DIGEST = "6fe4a741f98b1d2cd398351df4a9f880cbdaad9ce957f14fd7270e9d3a6ecd58"
"""sha256 over every shipped suite's plan (file, case id, skip reason, duplicate), as planned
before suites could opt in to plain twins: the speculative cases of every suite, with or
without ``speedup``, are exactly these."""

SPEEDUP_SUITES = {"smoke.toml", "tree-page.toml", "timing.toml"}
"""The shipped suites whose records carry speedup over plain decoding."""


def test_shipped_suites_plan_the_same_speculative_cases_with_or_without_twins():
    h = hashlib.sha256()
    for p in sorted(SUITES.glob("*.toml")):
        # byo-oracle's checkpoints are written first (test_own_model); serving and timing came after
        # the digest (tests/fixtures/shipped_case_ids.json pins serving's ids)
        if p.name in ("byo-oracle.toml", "serving.toml", "timing.toml"):
            continue
        suite = load_suite(p)
        assert suite.spec.suite.speedup is (p.name in SPEEDUP_SUITES)
        for c in (c for c in suite.plan() if not c.twin):
            h.update(f"{p.name} {c.case.case_id} {c.skip} {c.duplicate}\n".encode())
    assert h.hexdigest() == SHIPPED_PLAN_DIGEST


def speedup_suite(tmp_path, topks="[1, 2]"):
    """``harness_suite`` (page 1 and 64, batch 1 and 8) with ``[suite] speedup = true``."""
    plain = harness_suite(tmp_path, topks=topks)
    text = plain.path.read_text().replace("repeats = 1", "repeats = 1\nspeedup = true")
    p = tmp_path / "speedup.toml"
    p.write_text(text)
    return plain, load_suite(p)


def test_a_speedup_suite_plans_one_twin_per_target_right_before_its_first_case(tmp_path):
    plain, suite = speedup_suite(tmp_path)
    before, plan = plain.plan(), suite.plan()
    spec = [p for p in plan if not p.twin]
    assert [p.case.case_id for p in spec] == [p.case.case_id for p in before]  # spec case ids unchanged
    twins = [p for p in plan if p.twin]
    # one twin per (page, batch): topk 1 and 2 share it
    assert len(twins) == 4 and all(t.case.algorithm is Algorithm.NONE and t.skip is None for t in twins)
    ids = [p.case.case_id for p in plan]
    for p in spec:
        assert ids.index(p.case.plain_twin().case_id) < ids.index(p.case.case_id)
    groups = engine_groups(p.case for p in plan)
    # the twins of page 1 form one engine (batch sizes share one), ahead of page 1's spec engines
    assert [c.algorithm for c in groups[0]] == [Algorithm.NONE, Algorithm.NONE]
    assert len(groups) == len(engine_groups(p.case for p in before)) + 2


def test_a_matrix_refuses_the_plain_algorithm(tmp_path):
    p = tmp_path / "bad.toml"
    p.write_text(
        '[suite]\nname = "x"\n[[matrix]]\nalgorithm = ["NONE"]\nattention_backend = ["triton"]\n'
        "page_size = [1]\ntopk = [1]\n"
    )
    with pytest.raises(SpecwatchInputError, match=r"matrix\[0\]\.algorithm.*speedup = true"):
        load_suite(p)


def test_the_twin_keeps_the_target_and_drops_the_draft():
    c = Case(
        model="tiny",
        algorithm=Algorithm.EAGLE,
        attention_backend=Backend.fa3,
        page_size=64,
        topk=4,
        num_steps=3,
        num_draft_tokens=8,
        batch_size=8,
        input_len=512,
        output_len=256,
        profile="q=0.3",
    )
    t = c.plain_twin()
    assert (t.algorithm, t.topk, t.num_steps, t.num_draft_tokens, t.profile.value) == (
        Algorithm.NONE,
        1,
        1,
        1,
        "perfect",
    )
    assert (t.attention_backend, t.page_size, t.batch_size, t.input_len, t.output_len) == (
        c.attention_backend,
        64,
        8,
        512,
        256,
    )
    assert c.model_copy(update={"topk": 1, "num_draft_tokens": 4}).plain_twin().case_id == t.case_id


def test_a_where_selection_keeps_the_twins_of_the_cases_it_selects_and_no_other(tmp_path):
    _, suite = speedup_suite(tmp_path)
    picked = selected(suite.plan(), parse_where(["topk=2", "page_size=64"]))
    spec = [p for p in picked if not p.twin]
    assert len(spec) == 2 and all(p.case.topk == 2 and p.case.page_size == 64 for p in spec)
    assert {p.case.case_id for p in picked if p.twin} == {p.case.plain_twin().case_id for p in spec}
    assert len(picked) == 4  # page 64's two twins (batch 1 and 8); page 1's are left out


def test_without_twins_a_speedup_suite_plans_its_spec_cases_alone_under_its_own_name_and_hash(tmp_path):
    import json

    from typer.testing import CliRunner

    from specwatch.cli import app

    _, suite = speedup_suite(tmp_path)
    bare = suite.with_header(speedup=False)
    assert [p.case.case_id for p in bare.plan()] == [p.case.case_id for p in suite.plan() if not p.twin]
    assert (bare.name, bare.sha256, bare.path) == (suite.name, suite.sha256, suite.path)
    assert suite.spec.suite.speedup  # the loaded suite is left as it was
    res = CliRunner().invoke(app, ["plan", str(suite.path), "--json", "--where", "topk=2", "--no-twins"])
    assert res.exit_code == 0, res.output
    algos = [json.loads(line)["algorithm"] for line in res.output.splitlines()]
    assert algos and "NONE" not in algos


def test_a_run_selected_by_where_records_speedup_on_every_selected_case(tmp_path):
    _, suite = speedup_suite(tmp_path)
    env = {"PYTHONPATH": HERE + os.pathsep + os.environ.get("PYTHONPATH", "")}
    opts = RunOptions(gpus=1, worker_module="fake_worker", extra_env=env, where=parse_where(["topk=2"]))
    recs = list(read_records(run_suite(suite, tmp_path / "results", opts)))
    spec = [r for r in recs if r.case.algorithm is not Algorithm.NONE]
    assert len(spec) == 4 and all(r.case.topk == 2 and SPEEDUP in r.metrics for r in spec)


def _run(tmp_path, suite, **env):
    env = {"PYTHONPATH": HERE + os.pathsep + os.environ.get("PYTHONPATH", ""), **env}
    out = run_suite(suite, tmp_path / "results", RunOptions(gpus=1, worker_module="fake_worker", extra_env=env))
    return list(read_records(out))


def test_spec_records_carry_their_speedup_over_the_recorded_twin(tmp_path):
    _, suite = speedup_suite(tmp_path)
    recs = _run(tmp_path, suite, FAKE_STEP_MS="2")
    assert all(r.status is Status.ok for r in recs) and len(recs) == 12
    twins = {r.case_id: r for r in recs if r.case.algorithm is Algorithm.NONE}
    spec = [r for r in recs if r.case.algorithm is not Algorithm.NONE]
    assert len(twins) == 4 and len(spec) == 8
    assert all(SPEEDUP not in t.metrics and t.plain_twin is None for t in twins.values())
    for r in spec:
        twin = twins[r.case.plain_twin().case_id]
        # fake worker: spec 100 x page, plain 50 x page tokens/s; step time 6 ms vs 2 ms
        assert r.metrics[SPEEDUP].value == pytest.approx(2.0) and r.metrics[SPEEDUP].unit == "x"
        assert r.metrics[BREAK_EVEN].value == pytest.approx(3.0)
        assert r.plain_twin == record_id(twin.case_id, twin.provenance.started_at)


def test_a_resumed_run_uses_the_twin_already_in_the_results_file(tmp_path):
    _, suite = speedup_suite(tmp_path)
    env = {"PYTHONPATH": HERE + os.pathsep + os.environ.get("PYTHONPATH", "")}
    root = tmp_path / "results"
    opts = dict(gpus=1, worker_module="fake_worker", extra_env=env)
    run_suite(suite, root, RunOptions(**opts, max_groups=1))  # page 1's twins only
    out = run_suite(suite, root, RunOptions(**opts, resume=True))
    spec = [r for r in read_records(out) if r.case.algorithm is not Algorithm.NONE]
    assert len(spec) == 8 and all(r.metrics[SPEEDUP].value == pytest.approx(2.0) for r in spec)


def test_a_suite_without_the_key_records_no_twin_and_no_speedup(tmp_path):
    recs = _run(tmp_path, harness_suite(tmp_path))
    assert len(recs) == 8 and not any(r.case.algorithm is Algorithm.NONE or SPEEDUP in r.metrics for r in recs)


def test_the_plain_engine_gets_no_speculative_argument():
    from specwatch.worker.engine_args import engine_kwargs

    c = Case(
        model="tiny",
        algorithm=Algorithm.NONE,
        attention_backend=Backend.triton,
        page_size=64,
        topk=1,
        num_steps=1,
        num_draft_tokens=1,
        batch_size=1,
        input_len=128,
        output_len=128,
    )
    kw = engine_kwargs(c, Path("/m/target"), Path("/m/draft"), 1)
    assert not [k for k in kw if k.startswith("speculative")]
    spec = engine_kwargs(c.model_copy(update={"algorithm": Algorithm.EAGLE}), Path("/t"), Path("/d"), 1)
    assert spec["speculative_algorithm"] == "EAGLE" and spec["speculative_draft_model_path"] == "/d"


def _plain_and_spec(spec_tps=200.0, plain_tps=100.0, stored=True):
    from records import case, record
    from specwatch.core.record import Metric
    from specwatch.store.twins import with_speedup

    spec = record(case(), tps=spec_tps)
    plain = record(case().plain_twin(), tps=plain_tps)
    for r, step in ((spec, 6.0), (plain, 2.0)):
        r.metrics["step_time"] = Metric(value=step, unit="ms", higher_is_better=False)
    return (with_speedup(spec, plain) if stored else spec), plain


def test_compare_reports_a_speedup_column_only_where_the_head_has_one():
    from specwatch.analysis.compare import compare_records
    from specwatch.analysis.compare_report import markdown

    spec, plain = _plain_and_spec()
    text = markdown(compare_records([spec, plain], [spec, plain]), "a", "b", show_unchanged=True)
    assert "| ratio | speedup | note |" in text
    assert f"| `{spec.case_id}` " in text and "| 2.00x |" in text
    bare, _ = _plain_and_spec(stored=False)
    text = markdown(compare_records([bare], [bare]), "a", "b", show_unchanged=True)
    assert "| verdict | case | metric | base | head | ratio | note |" in text and "speedup" not in text


def test_compare_derives_the_speedup_of_a_case_whose_twin_was_recorded_after_it():
    from specwatch.analysis.compare import compare_records
    from specwatch.analysis.compare_report import markdown

    late, plain = _plain_and_spec(stored=False)  # the spec record was written before its twin
    rows = compare_records([late, plain], [late, plain])
    assert {r.metric for r in rows if r.case_id == late.case_id} >= {"speedup", "break_even_accept_length"}
    text = markdown(rows, "a", "b", show_unchanged=True)
    assert f"| `{late.case_id}` " in text and "| 2.00x |" in text
    other_suite = plain.model_copy(update={"suite": "tree-page"})  # a twin of another results file
    assert not any(r.speedup for r in compare_records([late, other_suite], [late, other_suite]))


def test_the_dashboard_table_computes_a_speedup_the_record_lacks_from_its_twin():
    from specwatch.analysis.speedup import speedup_frame
    from specwatch.store.frame import records_frame

    spec, plain = _plain_and_spec(spec_tps=300.0, stored=False)  # twin recorded after the spec case
    (row,) = speedup_frame(records_frame([spec, plain])).to_dict("records")
    assert row["speedup"] == pytest.approx(3.0) and row["break-even accept_length"] == pytest.approx(3.0)
    assert row["plain tokens/s"] == 100.0
    assert speedup_frame(records_frame([spec])).empty  # no twin anywhere: no table


def test_a_record_without_a_twin_is_written_as_before():
    import json

    from records import record
    from specwatch.core.record import parse_record

    r = record()
    assert "plain_twin" not in json.loads(r.model_dump_json())  # older readers refuse unknown keys
    twinned = parse_record(json.loads(r.model_copy(update={"plain_twin": "abc@20261130T000000Z"}).model_dump_json()))
    assert twinned.plain_twin == "abc@20261130T000000Z"


def test_the_speedup_figure_plots_the_newest_version_per_backend_and_nothing_without_twins(tmp_path):
    from records import case, record
    from specwatch.present.speedup_plots import newest_points, speedup_figure
    from specwatch.store.frame import records_frame
    from specwatch.store.twins import with_speedup

    recs = []
    for version, tps in (("0.5.22", 150.0), ("0.5.23", 300.0)):
        for backend in (Backend.triton, Backend.flashinfer):
            for topk in (1, 4):
                c = case(attention_backend=backend, topk=topk)
                plain = record(c.plain_twin(), tps=100.0, sglang_version=version)
                recs += [with_speedup(record(c, tps=tps, sglang_version=version), plain), plain]
    points = newest_points(records_frame(recs))
    assert set(points.sglang) == {"0.5.23"} and len(points) == 4
    assert points.speedup.tolist() == pytest.approx([3.0] * 4)
    files = speedup_figure(records_frame(recs), tmp_path)
    assert sorted(f.suffix for f in files) == [".png", ".svg"] and all(f.stat().st_size > 0 for f in files)
    no_twins = [r for r in recs if r.case.algorithm is not Algorithm.NONE]
    assert speedup_figure(records_frame(no_twins), tmp_path / "none") == []


def test_the_clean_points_found_with_the_table_are_the_points_of_the_clean_records():
    """``point_sets``: the points of the records ``keep`` holds, found in the table's pass, equal
    ``speedup_points`` of those records alone (faulted and bare runs left out, their twins too)."""
    import pandas as pd

    from records import case, record
    from specwatch.analysis.speedup import point_sets, speedup_points
    from specwatch.present.dashboard import clean_mask
    from specwatch.store.frame import records_frame

    recs = []
    for version in ("0.5.22", "0.5.23"):
        for topk, fault, probe in ((1, None, True), (4, None, True), (4, "fault-x", True), (8, None, False)):
            c = case(topk=topk)
            kw = dict(sglang_version=version, fault=fault, probe=probe)
            recs += [record(c, tps=100.0 * topk, **kw), record(c.plain_twin(), tps=50.0, **kw)]
    # a suite whose plain twin only a faulted run recorded: its clean spec case has no point of its own
    for c, tps, fault in ((case(topk=2), 80.0, None), (case(topk=2).plain_twin(), 40.0, "fault-x")):
        recs.append(record(c, tps=tps, fault=fault))
        recs[-1].suite = "faults"
    df = records_frame(recs)
    keep = clean_mask(df)
    points, clean = point_sets(df, keep)
    pd.testing.assert_frame_equal(points, speedup_points(df))
    pd.testing.assert_frame_equal(clean, speedup_points(df[keep]))
    assert len(points) > len(clean) > 0 and set(clean.topk) == {1, 4}


def test_a_plain_twin_id_found_once_is_the_twin_derived_from_each_row():
    from records import case, record
    from specwatch.core.case import Case, Profile
    from specwatch.store.frame import records_frame
    from specwatch.store.frame_dicts import row_dicts
    from specwatch.store.row_case import derived_case_id, plain_twin_id

    cases = [case(topk=k, num_steps=s, profile=p) for k in (1, 4) for s in (2, 3) for p in Profile]
    rows = row_dicts(records_frame([record(c) for c in cases]), True)
    ids = [plain_twin_id(r) for r in rows]
    assert ids == [derived_case_id(r, Case.plain_twin) for r in rows] == [c.plain_twin().case_id for c in cases]
    assert len(set(ids)) == 1  # cases that differ only in their draft share one twin
