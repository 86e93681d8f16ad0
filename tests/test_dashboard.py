import shutil
import subprocess
from datetime import timedelta

import pytest

from records import case, record
from specwatch.present.dashboard import build
from specwatch.store.frame import records_frame
from specwatch.store.jsonl import (
    append_record,
    load_records,
    result_files,
    results_path,
)


def _frame(tmp_path):
    for k in (1, 4, 8):
        r = record(case(topk=k, num_draft_tokens=8 if k > 1 else 4))
        from specwatch.core.record import Metric

        r.metrics["req_to_token_bytes"] = Metric(value=9 * (8192 + 100 * k) * 4, unit="bytes", exact=True)
        r.metrics["decode_throughput"] = Metric(value=1000 / k, unit="tokens/s", samples=[1000 / k])
        r.metrics["accept_length"] = Metric(value=4.0, unit="tokens/verify", exact=True)
        append_record(results_path(tmp_path / "results", "m", "0.5.17", "smoke"), r)
    return records_frame(load_records(result_files(tmp_path / "results")))


def test_dashboard_writes_plots_and_index(tmp_path):
    index = build(_frame(tmp_path), tmp_path / "dash")
    text = index.read_text()
    for name in ("memory_vs_topk", "throughput_vs_topk", "acceptance_vs_topk", "across_versions"):
        assert f"plots/{name}.png" in text
        assert (tmp_path / "dash" / "plots" / f"{name}.png").stat().st_size > 10_000
        assert (tmp_path / "dash" / "plots" / f"{name}.svg").exists()
    assert "<table" in text and 'href="cases.html"' in text
    assert (
        text.index('id="verdict"') < text.index('id="contents"') < text.index('id="plots"') < text.index('id="health"')
    )
    assert "decode_throughput" in (tmp_path / "dash" / "cases.html").read_text()


def test_build_refuses_no_records_and_leaves_the_dashboard_as_it_is(tmp_path):
    import pandas as pd
    from typer.testing import CliRunner

    from specwatch.cli import app
    from specwatch.core.errors import SpecwatchInputError

    (tmp_path / "index.html").write_text("committed")
    with pytest.raises(SpecwatchInputError, match="no records"):
        build(pd.DataFrame(), tmp_path, source=tmp_path / "typo")
    result = CliRunner().invoke(app, ["dashboard", "--results", str(tmp_path / "typo"), "--out", str(tmp_path)])
    assert result.exit_code == 2 and "Traceback" not in result.output  # typer: the folder does not exist
    (tmp_path / "empty").mkdir()
    result = CliRunner().invoke(app, ["dashboard", "--results", str(tmp_path / "empty"), "--out", str(tmp_path)])
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert isinstance(result.exception, SpecwatchInputError) and "no records" in str(result.exception)
    assert (tmp_path / "index.html").read_text() == "committed"


def test_case_table_writes_numbers_readably_and_unmeasured_cells_as_a_dash(tmp_path):
    from specwatch.present.dashboard import fmt_value

    assert [fmt_value(v) for v in (295200.0, 2952.34, 869.64, 3.94375, 0.00012, float("nan"), None, 4.0)] == [
        "295,200",
        "2,952",
        "869.6",
        "3.944",
        "0.00012",
        "–",
        "–",
        "4",
    ]
    df = _frame(tmp_path)
    df.loc[df.topk == 8, "decode_throughput"] = float("nan")
    build(df, tmp_path / "dash")
    page = (tmp_path / "dash" / "cases.html").read_text()
    cells = page[page.index("<tbody>") : page.index("</tbody>")]
    assert ">298,512<" in cells and ">323,712<" in cells  # req_to_token_bytes 9 * (8192 + 100k) * 4
    assert "e+0" not in cells and "nan" not in cells.lower() and "–" in cells
    assert 'data-v="1000.0"' in cells and "<script>" in page and "http" not in page.split("<script>")[1]


def test_reports_are_rendered_to_html_with_names_and_contents_escaped(tmp_path):
    out = tmp_path / "dash"
    (out / "reports").mkdir(parents=True)
    md = out / "reports" / "a&b <x>.md"
    md.write_text(
        "## specwatch: `head` vs `base`\n\n1 regressed\n\n| verdict | note |\n|---|---|\n"
        "| regressed | <script>alert(1)</script> |\n\n<details><summary>2 case(s) only in head</summary>\n\n"
        "| verdict |\n|---|\n| new |\n\n</details>\n"
    )
    before = md.read_bytes()
    index = build(_frame(tmp_path), out).read_text()
    assert 'href="reports/a%26b%20%3Cx%3E.html"' in index and "a&amp;b &lt;x&gt;" in index
    page = (out / "reports" / "a&b <x>.html").read_text()
    assert "<script>alert" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<details><summary>2 case(s) only in head</summary>" in page and page.count("<table") == 2
    assert md.read_bytes() == before


def test_legends_list_at_most_twelve_entries_and_fold_the_rest_into_more():
    import matplotlib.pyplot as plt

    from specwatch.present.plots import FOLDED_COLOR, capped_legend

    fig, ax = plt.subplots()
    lines = [ax.plot([0, 1], [i, i], label=f"case {i}")[0] for i in range(20)]
    texts = [t.get_text() for t in capped_legend(ax).get_texts()]
    plt.close(fig)
    assert len(texts) == 12 and texts[:11] == [f"case {i}" for i in range(11)] and texts[-1] == "+9 more"
    assert all(line.get_color() == FOLDED_COLOR for line in lines[11:]) and lines[10].get_color() != FOLDED_COLOR
    assert [list(line.get_ydata()) for line in lines] == [[i, i] for i in range(20)]  # data as drawn


def _chromium():
    return shutil.which("chromium") or shutil.which("chromium-browser")


CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--hide-scrollbars",
    "--window-size=1366,768",
]

MEASURE = """<script>(function () {
  var box = function (id) { var r = document.getElementById(id).getBoundingClientRect();
                            return [Math.round(r.top), Math.round(r.bottom)].join(","); };
  document.body.setAttribute("data-measured", ["verdict-banner", "n-regressions", "suite-health"].map(box).join(";"));
})();</script>"""
"""Writes where the verdict's parts lie in the viewport (top,bottom per element) into the DOM."""


@pytest.mark.skipif(not _chromium(), reason="chromium not installed (apt-get install chromium) — browser check skipped")
def test_dashboard_shows_the_verdict_on_the_first_screen_in_headless_chromium(tmp_path):
    import re

    from specwatch.analysis.verdict import release_verdict
    from test_verdict import _two_releases

    root = tmp_path / "results"
    _two_releases(root)
    index = build(records_frame(load_records(result_files(root))), tmp_path / "dash", verdict=release_verdict(root))
    shot = tmp_path / "shot.png"
    subprocess.run(
        [
            _chromium(),
            *CHROMIUM_FLAGS,
            f"--user-data-dir={tmp_path / 'profile'}",
            f"--screenshot={shot}",
            index.as_uri(),
        ],
        check=True,
        timeout=120,
        capture_output=True,
    )
    probe = index.with_name("measured.html")
    probe.write_text(index.read_text().replace("</body>", MEASURE + "</body>"))
    dom = subprocess.run(
        [_chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile2'}", "--dump-dom", probe.as_uri()],
        check=True,
        timeout=120,
        capture_output=True,
        text=True,
    ).stdout
    assert shot.stat().st_size > 20_000
    assert dom.count("<img") == 4 and "<table" in dom
    assert "1 regression, 1 new failure" in dom
    boxes = [tuple(map(int, b.split(","))) for b in re.search(r'data-measured="([^"]+)"', dom).group(1).split(";")]
    assert all(0 <= top < bottom <= 768 for top, bottom in boxes), boxes


def test_fault_table_puts_each_fault_run_beside_the_clean_run():
    from specwatch.analysis.health import fault_table
    from specwatch.core.record import Status

    c = case(page_size=64, topk=8, num_draft_tokens=16)
    clean, faulty = record(c), record(c, fault="accept-off-by-one")
    clean.checks["lossless"], faulty.checks["lossless"] = True, False
    from specwatch.core.record import Metric

    faulty.metrics["fault_code_runs"] = Metric(value=64, unit="calls")
    crashed = record(
        case(page_size=256, topk=8, num_draft_tokens=16),
        status=Status.crashed,
        reason="AssertionError: draft over-allocation",
        fault="row-widen-revert",
    )
    t = fault_table(records_frame([clean, faulty, crashed]))
    rows = {r["fault"]: r for r in t.to_dict("records")}
    assert rows["accept-off-by-one"]["fault run"] == "failed: lossless"
    assert rows["accept-off-by-one"]["clean run"] == "all checks pass"
    assert rows["row-widen-revert"]["fault run"].startswith("crashed: AssertionError")
    assert rows["row-widen-revert"]["clean run"] == "no clean run"
    assert rows["accept-off-by-one"]["faulted code ran"] == "64 times in its engine"
    assert rows["row-widen-revert"]["faulted code ran"] == "not counted"  # crashed / an older record


def test_dcp_matrix_shows_outcomes_and_compares_outputs_with_the_dcp1_twin(tmp_path):
    from specwatch.analysis.dcp import dcp_matrix
    from specwatch.core.record import Metric, Status

    def dcp_record(dcp, digest, status=Status.ok, reason=None, backend="flashinfer", **kw):
        r = record(case(tp=2, dcp=dcp, attention_backend=backend, **kw), status=status, reason=reason)
        r.suite = "dcp"
        if status is Status.ok:
            r.details["output_digest"] = digest
            r.checks.update({"draft_pool_covers_allocator": True, "target_pool_covers_allocator": True})
            r.metrics["draft_pool_missing_rows"] = Metric(value=0, unit="slots", exact=True)
        return r

    recs = [
        dcp_record(1, "aa"),
        dcp_record(2, "aa"),  # same outputs
        dcp_record(1, "bb", page_size=1),
        dcp_record(2, "cc", page_size=1),  # different
        dcp_record(
            2,
            None,
            status=Status.crashed,
            backend="triton",
            reason="Capture cuda graph failed: DCP Triton extend does not support custom masks",
        ),
    ]
    rows = {(r["backend"], r["page"], r["dcp"]): r for r in dcp_matrix(records_frame(recs)).to_dict("records")}
    assert rows[("flashinfer", 64, 2)]["same outputs as dcp 1"] == "identical"
    assert rows[("flashinfer", 1, 2)]["same outputs as dcp 1"] == "DIFFERENT"
    assert rows[("flashinfer", 64, 1)]["same outputs as dcp 1"] == ""
    assert rows[("flashinfer", 64, 2)]["pools cover allocator"] == "yes, yes"
    # a probe that never read the target's attention backend judged the dcp-2 pool as sharded: say so
    recs[1].details["probe"] = {"dcp_size": 2}
    old_probe = {(r["page"], r["dcp"]): r for r in dcp_matrix(records_frame(recs[:2])).to_dict("records")}
    assert old_probe[(64, 2)]["pools cover allocator"].startswith("yes, yes (target judged as sharded")
    recs[1].details["probe"]["target_attention_backend"] = {"mentions_dcp": True}
    new_probe = {(r["page"], r["dcp"]): r for r in dcp_matrix(records_frame(recs[:2])).to_dict("records")}
    assert new_probe[(64, 2)]["pools cover allocator"] == "yes, yes"
    assert rows[("triton", 64, 2)]["outcome"].startswith("crashed: Capture cuda graph failed: DCP Triton")
    assert rows[("triton", 64, 2)]["same outputs as dcp 1"] == ""
    assert dcp_matrix(records_frame([record()])).empty  # no dcp suite, no table
    # near-full twins lengthen their prompts each to its own pool: judged by the oracle, not the digest
    twins = [dcp_record(d, str(d), page_size=16) for d in (1, 2)]
    for d, (t, ext) in enumerate(zip(twins, (384, 512))):
        t.details["near_full_calibration"] = {"input_len": 512 + ext}
        t.metrics["lossless_mismatches"] = Metric(value=d, unit="tokens", exact=True)  # the dcp-2 one: 1
    rows = {(r["page"], r["dcp"]): r for r in dcp_matrix(records_frame(twins)).to_dict("records")}
    assert rows[(16, 2)]["same outputs as dcp 1"] == "DIFFERENT"
    twins[1].metrics["lossless_mismatches"] = Metric(value=0, unit="tokens", exact=True)
    rows = {(r["page"], r["dcp"]): r for r in dcp_matrix(records_frame(twins)).to_dict("records")}
    assert rows[(16, 2)]["same outputs as dcp 1"] == "prompts calibrated apart; both lossless"

    from specwatch.analysis.dcp import dcp_summary

    recs.append(dcp_record(2, "dd", page_size=1, topk=1, num_draft_tokens=4))  # its dcp-1 twin never ran
    recs.append(
        dcp_record(
            2,
            None,
            status=Status.crashed,
            backend="triton",
            page_size=1,
            reason="worker exited with code -9 before finishing this case: Exception: boom",
        )
    )
    folded = {r["backend"]: r for r in dcp_summary(dcp_matrix(records_frame(recs))).to_dict("records")}
    assert folded["flashinfer"]["dcp 1 standard 128→256"] == "2/2 ok"
    assert folded["flashinfer"]["dcp 2 standard 128→256"] == "3/3 ok"
    assert folded["flashinfer"]["outputs = dcp 1"] == "1/2 identical"  # the twinless case is not counted
    assert folded["triton"]["dcp 1 standard 128→256"] == "not run"
    assert folded["triton"]["dcp 2 standard 128→256"] == (
        "0/2 ok; crashed: Capture cuda graph failed: DCP Triton extend "
        "does not support custom masks; crashed: Exception: boom"
    )
    assert folded["triton"]["outputs = dcp 1"] == ""
    # SGLang's refusal to start beside another run's memory on one GPU measured the host, not the case
    from specwatch.store.jsonl import append_record, recorded_case_ids, results_path

    unbalanced = dcp_record(
        1,
        None,
        status=Status.crashed,
        backend="triton",
        page_size=1,
        reason="worker exited with code -9 before finishing this case: RuntimeError: The memory "
        "capacity is unbalanced. Some GPUs may be occupied by other processes.",
    )
    matrix = dcp_matrix(records_frame(recs + [unbalanced]))
    assert (
        matrix[(matrix.backend == "triton") & (matrix.dcp == 1)]
        .outcome.iloc[0]
        .startswith("not measured (host interference)")
    )
    folded = {r["backend"]: r for r in dcp_summary(matrix).to_dict("records")}
    assert folded["triton"]["dcp 1 standard 128→256"] == "1 not measured (host interference)"
    assert folded["triton"]["dcp 2 standard 128→256"].startswith("0/2 ok;")
    # a newer such record does not hide an older measured one
    before = dcp_record(1, "ee", backend="triton", page_size=1)
    unbalanced.provenance.started_at = before.provenance.started_at + timedelta(hours=1)
    matrix = dcp_matrix(records_frame([before, unbalanced]))
    assert list(matrix.outcome) == ["ok"]
    # ...and `run --known` runs such a case again
    path = results_path(tmp_path, "m", "0.5.17", "dcp")
    for r in (recs[-1], unbalanced):
        append_record(path, r)
    assert recorded_case_ids(path) == {recs[-1].case_id}


def test_memory_plot_places_only_records_measured_at_the_lines_settings():
    from specwatch.core.record import Metric
    from specwatch.present.plots import measured_on_line

    def rec(bytes_, model_bytes, **kw):
        r = record(case(**kw))
        r.metrics["req_to_token_bytes"] = Metric(value=bytes_, unit="bytes", exact=True)
        r.metrics["model_req_to_token_bytes"] = Metric(value=model_bytes, unit="bytes", exact=True)
        return r

    df = records_frame([rec(1000, 1000, topk=4), rec(900, 900, topk=4, tp=2, dcp=2), rec(1000, 1000, topk=8)])
    on = measured_on_line(df, 64, 3, {4: 1000, 8: 2000})
    assert list(on.req_to_token_bytes) == [1000] and list(on.topk) == [4] and list(on.dcp) == [1]


def test_overhead_table_sets_each_probed_case_beside_its_bare_run():
    from datetime import timedelta

    from records import T0
    from specwatch.analysis.overhead import PROBE_CLOCK, overhead_table

    a, b, c = case(page_size=1), case(page_size=64), case(page_size=16)
    recs = [
        record(a, tps=1000.0),
        record(a, tps=1010.0, probe=False),  # -1.0%: within 2%
        record(b, tps=900.0),
        record(b, tps=1000.0, probe=False),  # -10%, one run each
        record(c, tps=950.0),
        record(c, tps=1000.0, probe=False),  # -5%, but two probed runs
        record(c, tps=1000.0, started_at=T0 - timedelta(days=1)),
    ]  # differ by 5.1%
    rows = {r["case"].split()[3]: r for r in overhead_table(records_frame(recs)).to_dict("records")}
    assert rows["p1"]["verdict"] == "within 2%" and rows["p1"]["specwatch / bare"] == round(1000 / 1010, 4)
    assert rows["p64"]["verdict"] == "slower by more than 2%" and rows["p64"]["run-to-run spread"] == "unmeasured"
    # the median of the probed runs (975) against the bare run: 2.5% slower, inside the 5.1% between runs
    assert rows["p16"]["specwatch / bare"] == 0.975 and rows["p16"]["runs bare / probed"] == "1 / 2"
    assert rows["p16"]["verdict"].startswith("inconclusive") and rows["p16"]["run-to-run spread"] == "5.1%"
    assert rows["p16"]["probe per step"] == "not recorded"
    from specwatch.core.record import Metric

    for r in (recs[4], recs[6]):  # the probe timed itself: 5 us a batch against 8 ms steps (0.0625%)
        r.metrics["probe_time_per_batch"] = Metric(value=5.0, unit="us")
        r.metrics["step_time"] = Metric(value=8.0, unit="ms")
    rows = {r["case"].split()[3]: r for r in overhead_table(records_frame(recs)).to_dict("records")}
    assert rows["p16"]["verdict"] == PROBE_CLOCK and rows["p16"]["probe per step"] == "0.062%"
    recs[4].metrics["probe_time_per_batch"] = recs[6].metrics["probe_time_per_batch"] = Metric(value=500.0, unit="us")
    rows = {r["case"].split()[3]: r for r in overhead_table(records_frame(recs)).to_dict("records")}
    assert rows["p16"]["verdict"].startswith("inconclusive")  # 6% of a step: the clock cannot clear it
    recs.append(record(c, tps=1001.0, probe=False, started_at=T0 - timedelta(days=2)))
    recs[6] = record(c, tps=951.0, started_at=T0 - timedelta(days=1))  # runs agree within 0.1%
    rows = {r["case"].split()[3]: r for r in overhead_table(records_frame(recs)).to_dict("records")}
    assert rows["p16"]["verdict"] == "slower by more than 2%"
    assert overhead_table(records_frame([record(a)])).empty


def test_health_matrix_shows_coverage_and_what_went_wrong(tmp_path):
    """A suite planning page 1/64 x topk 1/4 x batch 1/8: a crash, a failed lossless check, a
    cell never run, a re-run that fixed an earlier timeout, and a row with no record at all."""
    from datetime import timedelta

    from records import T0
    from specwatch.analysis.health import health_matrix
    from specwatch.core.record import Status
    from specwatch.suite import load_suite

    (tmp_path / "grid.toml").write_text("""
[suite]
name = "grid"
[[matrix]]
attention_backend = ["triton", "fa3"]
page_size = [1, 64]
topk = [1, 4]
num_draft_tokens = [8]
batch_size = [1, 8]
""")
    plan = {
        (p.case.attention_backend.value, p.case.page_size, p.case.topk, p.case.batch_size): p.case
        for p in load_suite(tmp_path / "grid.toml").plan()
    }
    recs = []
    for (be, page, topk, bs), c in plan.items():
        if be == "fa3" or (page, topk) == (64, 4) or (page, topk, bs) == (1, 1, 8):
            continue  # fa3: nothing; p64 k4: not run; one half-run cell
        r = record(c)
        r.suite = "grid"
        r.checks["lossless"] = not (page, topk, bs) == (1, 4, 8)
        if (page, topk, bs) == (64, 1, 8):
            r = record(c, status=Status.crashed, reason="boom")
            r.suite = "grid"
        if (page, topk, bs) == (1, 1, 1):  # timed out first, ok on the re-run
            early = record(c, status=Status.timeout, reason="slow", started_at=T0 - timedelta(hours=1))
            early.suite = "grid"
            recs.append(early)
        recs.append(r)
    h = health_matrix(records_frame(recs), tmp_path).set_index(["backend", "page"])
    assert list(h.index) == [("triton", 1), ("triton", 64)]  # fa3 ran nothing: no row
    assert h.loc[("triton", 1), "topk 1"] == "1/2 ok; 1 not run"
    assert h.loc[("triton", 1), "topk 4"] == "2/2 ok; lossless ✗ 1"
    assert h.loc[("triton", 64), "topk 1"] == "1/2 ok; 1 crashed"
    assert h.loc[("triton", 64), "topk 4"] == "not run"


def test_a_version_that_ran_nothing_ok_keeps_its_place_on_the_version_axis():
    from specwatch.core.record import Status
    from specwatch.present.version_history import version_axis

    recs = []
    for v, status in (("0.5.14", Status.ok), ("0.5.15", Status.crashed), ("0.5.16", Status.ok)):
        for page in (1, 64):
            r = record(case(page_size=page), status=status, reason=None if status is Status.ok else "boom")
            r.provenance.sglang_version = v
            recs.append(r)
    recs[-1] = record(case(page_size=64), status=Status.timeout, reason="slow")  # 0.5.16 p64 not ok
    recs[-1].provenance.sglang_version = "0.5.16"
    versions, labels, common = version_axis(records_frame(recs))
    assert versions == ["0.5.14", "0.5.15", "0.5.16"]
    assert labels[0] == "0.5.14" and labels[1] == "0.5.15\nno ok case:\n2 crashed" and labels[2] == "0.5.16"
    assert common == [case(page_size=1).case_id]  # ok on 0.5.14 and 0.5.16 (0.5.15 ran none)
    assert version_axis(records_frame([])) == ([], [], [])


def test_timing_plots_leave_out_runs_whose_starts_overlapped_timed_batches():
    from specwatch.present.plots import timing_records

    waves, overlapped = record(case()), record(case(page_size=1))
    overlapped.details["overlap_starts"] = True
    df = records_frame([waves, overlapped])
    assert list(df.overlap_starts) == [False, True]
    assert list(timing_records(df).case_id) == [waves.case_id]
    assert list(timing_records(df.drop(columns="overlap_starts")).case_id) == [waves.case_id, overlapped.case_id]


def test_a_leak_that_is_the_radix_cache_left_by_a_refused_flush_is_named_so():
    from specwatch.analysis.health import health_matrix
    from specwatch.core.record import Metric
    from specwatch.store.frame import records_frame

    cached, lost = record(case()), record(case(page_size=1))
    for r, held in ((cached, 640), (lost, 0)):  # 640 tokens not free; the cache held them or not
        r.metrics["leaked_tokens"] = Metric(value=640, unit="tokens", exact=True, higher_is_better=False)
        r.checks["no_kv_leak"] = False
        r.details = {"probe": {"tree_cache_evictable_size": held, "tree_cache_protected_size": 0}}
    df = records_frame([cached, lost])
    assert list(df.leak_is_unflushed_cache) == [True, False]
    cells = " ".join(str(v) for v in health_matrix(df, suites_dir=None).filter(like="topk").values.ravel())
    assert "no_kv_leak ✗ 1 (of which 1: radix cache left by a refused flush" in cells
    assert cells.count("no_kv_leak ✗ 1") == 2


def test_by_topk_plots_take_the_tiny_oracle_on_the_newest_version():
    from specwatch.core.case import ModelSize
    from specwatch.present.plots import newest_tiny
    from specwatch.store.frame import records_frame

    old, new, big = (
        record(case(page_size=1), sglang_version="0.5.9"),
        record(case(), sglang_version="0.5.17"),
        record(case(model=ModelSize.llama_8b), sglang_version="0.5.17"),
    )
    faulty = record(case(page_size=16), sglang_version="0.5.17", fault="row-widen-revert")
    picked, label = newest_tiny(records_frame([old, new, big, faulty]))
    assert list(picked.case_id) == [new.case_id] and label == "tiny, SGLang 0.5.17"


def test_a_row_mismatch_that_todays_model_explains_is_named_so():
    from specwatch.analysis.health import health_matrix
    from specwatch.core.record import Metric
    from specwatch.store.frame import records_frame

    # flashinfer page 64 topk 4, context 8192: 0.5.12 measured 8204-slot rows, which the model of the
    # day (the reserve rule of 0.5.13-0.5.15: 9216) called a mismatch; 0.5.13 with 8204 would be one
    old, wrong = (record(case(attention_backend="flashinfer"), sglang_version=v) for v in ("0.5.12", "0.5.13"))
    for r in (old, wrong):
        r.metrics["req_to_token_row_width"] = Metric(value=8204, unit="tokens", exact=True)
        r.metrics["req_to_token_bytes"] = Metric(value=2 * 8204 * 4, unit="bytes", exact=True)
        r.checks["req_to_token_matches_model"] = False
    df = records_frame([old, wrong])
    assert list(df.row_matches_model_now) == [True, False]
    cells = " ".join(str(v) for v in health_matrix(df, suites_dir=None).filter(like="topk").values.ravel())
    assert cells.count("req_to_token_matches_model ✗ 1") == 2
    assert cells.count("(of which 1: match today's model") == 1


def test_across_versions_takes_exact_metrics_from_every_run_and_timing_from_wave_runs_only():
    from specwatch.present.version_history import version_lines
    from specwatch.store.frame import records_frame

    waves = [record(case(page_size=1), sglang_version=v) for v in ("0.5.12", "0.5.17")]
    overlapped = [record(case(attention_backend="flashinfer"), sglang_version=v) for v in ("0.5.12", "0.5.17")]
    faulty = record(case(page_size=1), sglang_version="0.5.17", fault="row-widen-revert", tps=1.0)
    for r in overlapped:
        r.details["overlap_starts"] = True
    df = records_frame(waves + overlapped + [faulty])
    _, _, timed_common, timed = version_lines(df, "output_throughput")
    _, _, exact_common, exact = version_lines(df, "accept_length")
    assert timed_common == [waves[0].case_id]
    assert sorted(exact_common) == sorted({waves[0].case_id, overlapped[0].case_id})
    assert 1.0 not in set(timed.output_throughput)  # a fault run is not a release's value


def test_across_versions_reads_one_machine_so_a_newer_record_on_another_host_is_no_release_value():
    from specwatch.present.version_history import version_lines, version_machine
    from specwatch.store.frame import records_frame

    c = case(page_size=1)
    history = [record(c, sglang_version=v, tps=100.0) for v in ("0.5.12", "0.5.17")]
    elsewhere = record(c, sglang_version="0.5.17", tps=1.0)  # the latest 0.5.17 record, another host
    elsewhere.provenance.machine = "other-host-x1"
    elsewhere.provenance.started_at = history[-1].provenance.started_at.replace(year=2100)
    df = records_frame([*history, elsewhere])
    assert version_machine(df) == history[0].provenance.machine
    _, _, common, latest = version_lines(df, "output_throughput")
    assert common == [c.case_id] and set(latest.output_throughput) == {100.0}


def test_memory_plot_draws_one_release_its_model_and_its_records(tmp_path, monkeypatch):
    import specwatch.present.plots as plots
    from specwatch.store.frame import records_frame

    old, new = record(case(), sglang_version="0.5.9"), record(case(page_size=1), sglang_version="0.5.13")
    seen = []
    monkeypatch.setattr(plots, "measured_on_line", lambda df, *a: seen.append(set(df.sglang_version)) or df.iloc[0:0])
    df = records_frame([old, new]).assign(req_to_token_bytes=1.0)
    plots.memory_vs_topk(df, tmp_path)
    assert seen and all(v == {"0.5.13"} for v in seen)  # 0.5.13 > 0.5.9: release order


def test_dcp_twins_on_prompts_drawn_apart_are_judged_by_the_oracle_not_called_different():
    """The H200 pair behind this test: the dcp-2 run of tiny STANDALONE flashinfer page 64 topk 1
    (specwatch before b9372a5) drew start 21 twice in its first timed batch; its dcp-1 twin ran
    after the distinct draw. Both lossless, digests differ. The digests are the ones the two H200
    runs recorded: the CPU oracle reproduces each from the draw that made it."""
    from specwatch.analysis.dcp import dcp_matrix, dcp_summary
    from specwatch.core.case import Algorithm, Backend
    from specwatch.core.record import Metric
    from specwatch.oracle.prompts import (
        lossless_output_digest,
        starts_behind_digest,
        timed_starts,
    )

    def twin(dcp, digest, starts=None):
        c = case(
            algorithm=Algorithm.STANDALONE,
            attention_backend=Backend.flashinfer,
            topk=1,
            num_draft_tokens=4,
            tp=2,
            dcp=dcp,
            batch_size=4,
            input_len=1152,
            output_len=256,
        )
        r = record(c)
        r.suite = "dcp"
        r.metrics["wall_time"] = Metric(value=0.4, unit="s", samples=[0.4, 0.4, 0.4])
        r.metrics["lossless_mismatches"] = Metric(value=0, unit="tokens", exact=True)
        r.details["output_digest"] = digest
        if starts is not None:
            r.details["prompt_starts"] = starts
        return r

    old, new = "5c21133b96f68c73", "d620775d42b1ec9d"  # dcp 2 (plain draw), dcp 1 (distinct)
    c = twin(2, old).case
    assert timed_starts(c, 3, distinct=False)[0] == [21, 604, 21, 687]
    assert starts_behind_digest(c, 1152, 3, old) == timed_starts(c, 3, distinct=False)
    assert starts_behind_digest(c, 1152, 3, new) == timed_starts(c, 3)
    assert starts_behind_digest(c, 1152, 3, "0" * 16) is None
    assert lossless_output_digest(c, 1152, timed_starts(c, 3)) == new

    def verdict(recs):
        m = dcp_matrix(records_frame(recs))
        return m[m.dcp == 2]["same outputs as dcp 1"].item(), dcp_summary(m)["outputs = dcp 1"].item()

    # older records (no prompt_starts): the starts are reproduced from the digests
    assert verdict([twin(1, new), twin(2, old)]) == (
        "prompts drawn apart (specwatch's draw changed between the runs); both lossless",
        "1 on prompts drawn apart (both lossless)",
    )
    # recorded starts: the same prompts with different outputs are DIFFERENT, whatever the oracle says
    same = timed_starts(c, 3)
    assert verdict([twin(1, new, same), twin(2, old, same)])[0] == "DIFFERENT"
    assert verdict([twin(1, new, same), twin(2, new, same)]) == ("identical", "1/1 identical")
    # a dcp-2 run that is not lossless differs for a reason of its own: DIFFERENT
    bad = twin(2, old)
    bad.metrics["lossless_mismatches"] = Metric(value=3, unit="tokens", exact=True)
    assert verdict([twin(1, new), bad])[0] == "DIFFERENT"


def test_dcp_summary_names_each_cause_once_and_a_refusal_recorded_before_its_rule_as_a_skip(tmp_path):
    from specwatch.analysis.dcp import crash_cause, dcp_matrix, dcp_summary
    from specwatch.analysis.health import health_matrix
    from specwatch.core.case import Backend, ModelSize
    from specwatch.core.record import Status
    from specwatch.present.dashboard import build

    def rec(dcp, reason=None, tp=2, **kw):
        r = record(
            case(tp=tp, dcp=dcp, attention_backend=Backend.flashinfer, **kw),
            status=Status.crashed if reason else Status.ok,
            reason=reason,
        )
        r.suite = "dcp"
        return r

    assertion = (
        "worker exited with code -9 before finishing this case: device-side assertion in kvcache.cuh:209 "
        "store_kvcache: `index >= 0 && index < size_limit` failed ({} lines of it in the log); surfaced as: x"
    )
    assert (
        crash_cause(assertion.format(288))
        == crash_cause(assertion.format(64)[:170])
        == ("device-side assertion in kvcache.cuh:209 store_kvcache: `index >= 0 && index < size_limit` failed")
    )
    refusal = (
        "worker exited with code -9 before finishing this case: ValueError: "
        "Currently Flashinfer MLA only supports topk=1 for speculative decoding"
    )
    recs = [
        rec(2, assertion.format(288), page_size=1),
        rec(2, assertion.format(64), page_size=64),
        rec(1, refusal, model=ModelSize.tiny_mla, topk=4),
        rec(1, model=ModelSize.tiny_mla, topk=1, num_draft_tokens=4),
    ]
    m = dcp_matrix(records_frame(recs))
    mla = m[m.model == "tiny-mla"].set_index("topk").outcome
    assert (
        mla[4].startswith("skipped: mla-backend: Currently Flashinfer MLA only supports topk=1")
        and "recorded crashed before the rule" in mla[4]
    )
    assert mla[1] == "ok"
    s = dcp_summary(m).set_index("model")
    assert s.loc["tiny", "dcp 2 standard 128→256"] == "0/2 ok; crashed: " + crash_cause(assertion.format(1))
    assert s.loc["tiny-mla", "dcp 1 standard 128→256"] == "1/1 ok; 1 more skipped by rule"
    # a crash whose words are not the rule's stays a crash
    recs[2].reason = "worker exited with code -9 before finishing this case: RuntimeError: boom"
    assert (
        dcp_matrix(records_frame(recs)).query("model == 'tiny-mla' and topk == 4").outcome.item().startswith("crashed")
    )
    # the dashboard writes the two tables as markdown too
    build(records_frame(recs), tmp_path)
    md = (tmp_path / "dcp-support.md").read_text()
    assert (
        "## Summary" in md
        and "| 0/2 ok; crashed: device-side assertion" in md
        and "dcp-support.md" in (tmp_path / "index.html").read_text()
    )
    # dcp-large (tp 4/8) gets tables of its own, after dcp's, and stays out of the health matrix
    large = [
        rec(
            d,
            None
            if d == 1
            else "worker exited with code -9 before finishing this case: RuntimeError: "
            "The size of tensor a (6656) must match the size of tensor b (12288)",
            tp=4,
        )
        for d in (1, 4)
    ]
    for r in large:
        r.suite = "dcp-large"
    assert dcp_matrix(records_frame(recs + large)).tp.unique().tolist() == [2]
    big = dcp_summary(dcp_matrix(records_frame(recs + large), "dcp-large")).to_dict("records")
    assert [(r["tp"], r["dcp 1 standard 128→256"], r["dcp 4 standard 128→256"]) for r in big] == [
        (
            4,
            "1/1 ok",
            "0/1 ok; crashed: RuntimeError: The size of tensor a (6656) must match the size of tensor b (12288)",
        )
    ]
    build(records_frame(recs + large), tmp_path)
    md = (tmp_path / "dcp-support.md").read_text()
    assert md.index("## Matrix (`suites/dcp.toml`)") < md.index(
        "## Summary, folded over page size and topk (`suites/dcp-large.toml`)"
    )
    assert "dcp-large" not in health_matrix(records_frame(large)).to_string()


def test_dcp_matrix_shows_seed_004_facts_and_judges_the_page_flag_from_them():
    """Allocator page, each pool's page and valid range against the allocator's last page end in its
    slot space, and draft_pool_page_mismatch judged from those facts today (a record before 65d73a6
    stored a check comparing raw pages, and took NGRAM's shared target pool for a draft pool)."""
    from specwatch.analysis.dcp import dcp_matrix
    from specwatch.core.case import Algorithm, Backend
    from specwatch.rules.pools import pool_coverage

    allocator = {"size": 524288, "page_size": 128}  # dcp 2, page 64
    target = {"size": 262144, "page_size": 64, "rows": 262208}
    seed004 = {"size": 524288, "page_size": 64}  # draft pool paged by the server page
    replicated = {"size": 524288, "page_size": 128}

    def rec(algorithm, draft, virtual=False, stored_check=None):
        r = record(
            case(
                tp=2,
                dcp=2,
                attention_backend=Backend.flashinfer,
                algorithm=algorithm,
                topk=1,
                num_draft_tokens=4 if algorithm is Algorithm.EAGLE else 8,
            )
        )
        r.suite = "dcp"
        r.details["probe"] = {"allocator": allocator, "dcp_size": 2}
        r.details["pool_coverage"] = {
            "target": pool_coverage(allocator, target, virtual_slot_writes=virtual),
            "draft": pool_coverage(allocator, draft),
        }
        if stored_check is not None:
            r.checks["draft_pool_page_matches_allocator"] = stored_check
        return r

    rows = lambda recs: dcp_matrix(records_frame(recs)).to_dict("records")
    good, bad = rows([rec(Algorithm.EAGLE, replicated)])[0], rows([rec(Algorithm.EAGLE, seed004, virtual=True)])[0]
    assert good["allocator page"] == 128
    assert good["target pool"] == "page 64, valid to 262208 of 262208"
    assert good["draft pool"] == "page 128, valid to 524416 of 524416" and good["draft_pool_page_mismatch"] == "no"
    assert bad["draft pool"] == "page 64, valid to 524352 of 524416" and bad["draft_pool_page_mismatch"] == "YES"
    assert bad["target pool"] == "page 64, valid to 262208 of 524416"  # a backend with no DCP code
    # an old NGRAM record: its "draft pool" is the target's own, and its stored check compared raw pages
    ngram = rows([rec(Algorithm.NGRAM, target, stored_check=False)])[0]
    assert ngram["draft pool"] == "" and ngram["draft_pool_page_mismatch"] == ""
    old_eagle = rows([rec(Algorithm.EAGLE, replicated, stored_check=False)])[0]
    assert old_eagle["draft_pool_page_mismatch"] == "no"
