"""Models a suite names by path are read by their name in reports and the dashboard: the records
frame's ``model`` column, compare's labels, noise classes and ``model=NAME`` selections, the
dashboard's tables and plots; views bound to an oracle shape leave them out without failing."""

from pathlib import Path

import pytest

from records import case, record
from specwatch.core.case import ModelSize, OwnModel, PromptSet, case_id_of
from specwatch.core.record import CaseRecord, Metric, Status
from specwatch.store.frame import records_frame
from specwatch.store.jsonl import append_record, record_path

A, B = "llama31-8b-eagle3", "qwen3-8b-eagle3"
"""The two own models' names."""


def own_case(name: str, **kw):
    """An own model's EAGLE case at batch 8 (``name`` in its id through ``model_name``)."""
    own = OwnModel(name=name, config_sha="ab" * 8, target=f"/ckpt/{name}", draft=f"/ckpt/{name}-d", context_len=8192)
    fields = dict(page_size=1, topk=1, num_draft_tokens=4, batch_size=8)
    fields.update(kw)
    return case(model=ModelSize.own, own_model=own, prompts=PromptSet(source="mt-bench", count=8), **fields)


def rec(c, tps: float, version: str = "0.5.17", suite: str = "byo", **kw) -> CaseRecord:
    """An ok record of ``c``: output tokens/s ``tps`` over three repeats 1% apart, accept length 3."""
    r = record(c, tps=tps, sglang_version=version, **kw)
    samples = [tps * 0.99, tps, tps * 1.01]
    r.metrics["output_throughput"] = Metric(value=tps, unit="tokens/s", samples=samples, higher_is_better=True)
    r.metrics["decode_throughput"] = Metric(value=tps, unit="tokens/s", samples=samples, higher_is_better=True)
    r.metrics["accept_length"] = Metric(value=3.0, unit="tokens/verify", exact=True)
    return r.model_copy(update={"suite": suite})


def three(version: str = "0.5.17", tps: float = 100.0, suite: str = "byo") -> list[CaseRecord]:
    """One record of each own model and one of the tiny oracle, all at batch 8."""
    return [
        rec(own_case(A), tps, version, suite),
        rec(own_case(B), tps, version, suite),
        rec(case(batch_size=8), tps, version, suite),
    ]


def store(root: Path, recs: list[CaseRecord]) -> Path:
    for r in recs:
        append_record(record_path(root, r), r)
    return root


def test_the_frame_names_each_own_model_and_gives_back_the_parameters_its_id_hashes():
    from specwatch.store.row_case import derived_case_id, is_own_row, row_params

    recs = three()
    rows = records_frame(recs).to_dict("records")
    assert [r["model"] for r in rows] == [A, B, "tiny"]
    assert [is_own_row(r) for r in rows] == [True, True, False]
    for r, row in zip(recs, rows):
        assert row_params(row) == r.case.params() and case_id_of(row_params(row)) == r.case_id
        assert derived_case_id(row, lambda c: c.plain_twin()) == r.case.plain_twin().case_id


def test_compare_labels_and_classes_own_models_by_name_and_model_selects_one(tmp_path):
    from specwatch.analysis.compare import compare_specs
    from specwatch.analysis.compare_report import markdown
    from specwatch.store.select import select
    from specwatch.store.select_frame import select_rows

    root = store(tmp_path / "results", three("0.5.16") + three("0.5.17", tps=150.0))
    assert {r.case.own_model.name for r in select(f"model={B}", root)} == {B}
    assert set(select_rows(f"model={A}|tiny", root).model) == {A, "tiny"}
    assert {r.case.model.value for r in select("model=tiny", root)} == {"tiny"}
    rows = compare_specs(f"sglang_version=0.5.16,model={A}", f"sglang_version=0.5.17,model={A}", root)
    assert {r.case_id for r in rows} == {own_case(A).case_id}
    assert all(r.label.startswith(f"{A}/EAGLE") for r in rows)
    assert {r.noise_class for r in rows if r.timed} == {f"{A}/bs8"}
    text = markdown(rows, "0.5.16", "0.5.17")
    assert A in text and B not in text and "own/" not in text


def test_noise_budgets_and_the_detection_floor_keep_two_own_models_apart(tmp_path):
    from specwatch.analysis.compare import Verdict, compare_records, compare_specs
    from specwatch.analysis.floor import detection_floor
    from specwatch.analysis.noise import noise_report

    base, head = three(), three(tps=80.0)  # -20%, every head repeat below every base repeat
    budgets = {f"{A}/bs8": 0.5}  # A's A/A pairs moved a lot; B's class has no budget
    rows = {(r.label.split("/")[0], r.metric): r for r in compare_records(base, head, budgets=budgets)}
    assert rows[A, "output_throughput"].verdict is Verdict.unchanged
    assert rows[B, "output_throughput"].verdict is Verdict.regressed
    assert f"no noise budget for {B}/bs8/output_throughput" in rows[B, "output_throughput"].note
    # the frame path (compare's selections) classes them the same way
    root = store(tmp_path / "results", base + [r.model_copy(update={"suite": "byo2"}) for r in head])
    framed = {
        (r.label.split("/")[0], r.metric): r for r in compare_specs("suite=byo", "suite=byo2", root, budgets=budgets)
    }
    assert framed[A, "output_throughput"].verdict is Verdict.unchanged
    assert framed[B, "output_throughput"].verdict is Verdict.regressed
    assert {r.noise_class for r in framed.values() if r.timed} == {f"{A}/bs8", f"{B}/bs8", "tiny/bs8"}
    spread = noise_report(compare_records(base, head, threshold=0.0)).spread
    assert {k.rsplit("/", 1)[0] for k in spread} == {f"{A}/bs8", f"{B}/bs8", "tiny/bs8"}
    floor = detection_floor([(base, head)])
    assert set(floor.frame()["class"]) == {f"{A}/bs8", f"{B}/bs8", "tiny/bs8"}


def spec_and_twins() -> list[CaseRecord]:
    """Each own model's spec case at batch 1 and 8 recorded before its plain twin (no stored speedup),
    the twins at 100 tokens/s, A's spec at 200 and B's at 300."""
    out = []
    for name, tps in ((A, 200.0), (B, 300.0)):
        for bs in (1, 8):
            spec = own_case(name, batch_size=bs)
            out += [rec(spec, tps), rec(spec.plain_twin(), 100.0)]
    return out


def test_the_dashboard_names_own_models_in_its_tables_and_plots(tmp_path):
    import matplotlib.pyplot as plt

    from specwatch.analysis.health import failed_checks, health_matrix, throughput_spread
    from specwatch.analysis.roofline import roofline_rows
    from specwatch.analysis.speedup import speedup_frame, speedup_points
    from specwatch.present.dashboard import build
    from specwatch.present.speedup_plots import _panel
    from specwatch.present.version_history import case_name

    recs = spec_and_twins() + [rec(case(), 100.0, suite="smoke")]
    recs[0].checks["parity_with_plain"] = False
    df = records_frame(recs)
    table = speedup_frame(df)
    assert sorted(table.case.str.split().str[0]) == [A, A, B, B]
    assert sorted(table.speedup) == pytest.approx([2.0, 2.0, 3.0, 3.0])  # each twin found by its id
    ax = plt.subplots()[1]
    _panel(ax, speedup_points(df), "batch_size", "batch size")
    assert ax.get_legend_handles_labels()[1] == [f"{A} triton", f"{B} triton"]
    assert {case_name(r) for r in df.itertuples()} >= {f"{A} triton p1 k1 bs8", f"{B} triton p1 k1 bs1"}
    health = health_matrix(df, suites_dir=tmp_path)
    assert set(health[health.suite == "byo"].model) == {A, B}
    assert set(throughput_spread(df).model) == {A, B, "tiny"}
    assert failed_checks(df)["where"].tolist() == [f"byo {A} triton p1 k1 bs1"]
    assert roofline_rows(df).case_id.tolist() == [recs[-1].case_id]  # own models: no oracle shape
    out = tmp_path / "dash"
    build(df, out, tables={"Speedup": table})
    cases, index = (out / "cases.html").read_text(), (out / "index.html").read_text()
    assert A in cases and B in cases and ">own<" not in cases
    assert f"{A} EAGLE triton p1 k1 bs8" in index and f"{B} EAGLE" in index


def test_health_matrix_reads_the_records_of_a_suite_whose_own_checkpoints_are_not_on_this_host(tmp_path):
    from specwatch.analysis.health import health_matrix

    (tmp_path / "byo.toml").write_text(
        '[suite]\nname = "byo"\n[[matrix]]\nmodel = [{name = "x", target = "no/such/folder"}]\n'
        'algorithm = ["NGRAM"]\nattention_backend = ["triton"]\npage_size = [1]\ntopk = [1]\n'
        "num_steps = [3]\nnum_draft_tokens = [8]\nbatch_size = [8]\ninput_len = [128]\noutput_len = [16]\n"
        'prompts = "random"\nprompt_count = 8\n'
    )
    health = health_matrix(records_frame(three()), suites_dir=tmp_path)
    assert health.set_index("model")["topk 1"].to_dict() == {A: "1/1 ok", B: "1/1 ok", "tiny": "–"}


def test_the_dcp_matrix_and_the_asv_cases_take_own_models_without_a_shape_lookup(tmp_path):
    from specwatch.analysis.dcp import dcp_matrix
    from specwatch.present.asv_bridge import tree_page_cases

    dcp = [rec(own_case(A, tp=2, dcp=d), 100.0, suite="dcp") for d in (1, 2)]
    for r in dcp:
        r.details.output_digest = "same"
    crashed = record(own_case(B, tp=2, dcp=2), status=Status.crashed, reason="worker died: RuntimeError: x")
    matrix = dcp_matrix(records_frame([*dcp, crashed.model_copy(update={"suite": "dcp"})]))
    assert sorted(matrix.model) == [A, A, B]
    assert matrix[matrix.dcp == 2].set_index("model")["same outputs as dcp 1"].to_dict() == {A: "identical", B: ""}
    # an own model at the oracle case's backend, page, topk, batch and profile: the oracle's value stays
    oracle = case(batch_size=8)
    same_key = own_case(A, page_size=oracle.page_size, topk=oracle.topk, num_draft_tokens=oracle.num_draft_tokens)
    root = store(tmp_path / "results", [rec(oracle, 100.0, suite="tree-page"), rec(same_key, 999.0, suite="tree-page")])
    assert tree_page_cases(root, "0.5.17") == {
        (oracle.attention_backend.value, oracle.page_size, oracle.topk, 8, oracle.profile.value): {
            "decode_throughput": 100.0,
            "accept_length": 3.0,
        }
    }
