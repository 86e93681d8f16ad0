"""``specwatch run --baseline``: plain-loop baselines interleaved with the probed engine groups, the
overhead they give, and its columns in ``compare`` and the dashboard, on the fake worker and the
fake baseline (``tests/fake_baseline.py``)."""

import json
import os
import statistics
from types import SimpleNamespace

import pytest

from conftest import harness_suite, own_tmpdir_env
from records import case, record
from specwatch.core.case import Algorithm, Workload
from specwatch.core.protocol import BaselineLine, BaselineSpec
from specwatch.core.record import Metric, Status
from specwatch.run.baseline import BaselineJob, baseline_env, check_baseline, measures_baseline
from specwatch.run.group import PROBE_DIR, GroupJob
from specwatch.run.provenance import host_facts
from specwatch.run.runner import RunOptions, plan_run, run_suite
from specwatch.store.baseline import BASELINE_THROUGHPUT, OVERHEAD, baseline_metrics, overhead_cells, overhead_text
from specwatch.store.jsonl import read_records
from specwatch.suite import load_suite

HERE = os.path.dirname(__file__)
ENV = {"PYTHONPATH": HERE + os.pathsep + os.environ.get("PYTHONPATH", "")}


def _opts(**kw) -> RunOptions:
    return RunOptions(gpus=1, worker_module="fake_worker", baseline_module="fake_baseline", **kw)


def _suite(tmp_path, extra: str = ""):
    """``harness_suite`` (4 engine groups of batch 1 and 8) with ``extra`` in its header and 3 repeats."""
    text = harness_suite(tmp_path).path.read_text().replace("repeats = 1", f"repeats = 3\n{extra}")
    p = tmp_path / "b.toml"
    p.write_text(text)
    return load_suite(p)


def _run(tmp_path, suite, **env):
    order = tmp_path / "order.txt"
    out = run_suite(
        suite, tmp_path / "results", _opts(baseline=True, extra_env={**ENV, "FAKE_ORDER": str(order), **env})
    )
    return list(read_records(out)), order.read_text().split()


def test_the_flag_plans_baseline_jobs_for_every_engine_group(tmp_path):
    suite = _suite(tmp_path)
    facts = dict(host_facts(), gpu_count=1)
    _, plain = plan_run(suite, None, tmp_path / "r1", facts, _opts())
    _, both = plan_run(suite, None, tmp_path / "r2", facts, _opts(baseline=True))
    assert len(plain) == len(both) == 4
    assert not any(isinstance(j, BaselineJob) for j in plain) and all(isinstance(j, BaselineJob) for j in both)
    assert all(isinstance(j, GroupJob) for j in both)


def test_only_speculative_standard_oracle_cases_get_a_baseline(tmp_path):
    case = _suite(tmp_path).plan()[0].case
    assert measures_baseline(case)
    assert not measures_baseline(case.plain_twin())
    assert not measures_baseline(case.model_copy(update={"workload": Workload.serving}))


def test_probed_and_baseline_runs_alternate_and_records_carry_the_overhead(tmp_path):
    recs, order = _run(tmp_path, _suite(tmp_path), FAKE_TPS_SAMPLES="95,90,85", FAKE_BASELINE_TPS="100,102,98")
    assert order == ["probed", "baseline"] * 4  # A B per engine group, one host
    assert len(recs) == 8 and all(r.status is Status.ok for r in recs)
    for r in recs:
        assert r.details.baseline["order"] == ["probed0", "baseline0"]
        base, over = r.metrics[BASELINE_THROUGHPUT], r.metrics[OVERHEAD]
        assert base.value == 100.0 and base.samples == [100.0, 102.0, 98.0] and base.engine_medians is None
        assert over.value == pytest.approx(0.9) and over.samples == pytest.approx([0.95, 0.9, 0.85])
        assert overhead_text(r.metrics) == "0.900x (spread: probed 11.1%, baseline 4.0%)"


def test_with_engine_starts_the_group_goes_a_b_b_a_and_the_baseline_has_run_medians(tmp_path):
    recs, order = _run(tmp_path, _suite(tmp_path, "engine_starts = 3"), FAKE_BASELINE_TPS="100,110,90")
    assert order == ["probed", "baseline", "baseline", "probed", "probed", "baseline"] * 4  # serpentine
    r = recs[0]
    assert r.details.baseline["order"] == ["probed0", "baseline0", "baseline1", "probed1", "probed2", "baseline2"]
    assert [e["round"] for e in r.details.baseline["runs"]] == [0, 1, 2]
    base = r.metrics[BASELINE_THROUGHPUT]
    assert base.engine_medians == [100.0] * 3 and len(base.samples) == 9
    assert r.metrics[OVERHEAD].value == pytest.approx(r.metrics["output_throughput"].value / 100.0)
    assert r.details.engine_starts["ran"] == 3  # the probed starts merged as without --baseline


def test_a_crashed_baseline_is_a_recorded_reason_not_a_lost_case(tmp_path):
    recs, _ = _run(tmp_path, _suite(tmp_path), FAKE_BASELINE_CRASH="0")
    assert len(recs) == 8 and all(r.status is Status.ok for r in recs)
    for r in recs:
        assert OVERHEAD not in r.metrics and BASELINE_THROUGHPUT not in r.metrics
        (run,) = r.details.baseline["runs"]
        assert run["error"].startswith("baseline process exited with code -9: RuntimeError: scheduler died")
        assert r.details.baseline["reason"].startswith("no baseline run timed the case: baseline process exited")


def test_a_baseline_that_dies_mid_group_keeps_the_cases_it_finished(tmp_path):
    recs, _ = _run(tmp_path, _suite(tmp_path), FAKE_BASELINE_CRASH="1")
    by_batch = {}
    for r in recs:
        by_batch.setdefault(r.case.batch_size, []).append(r)
    assert all(OVERHEAD in r.metrics for r in by_batch[1])  # first in each group
    assert all(OVERHEAD not in r.metrics and "error" in r.details.baseline["runs"][0] for r in by_batch[8])


def test_a_case_the_probed_run_lost_gets_no_baseline_run(tmp_path):
    recs, order = _run(tmp_path, harness_suite(tmp_path, topks="[1, 4]"))
    crashed = [r for r in recs if r.status is Status.crashed]
    assert crashed and all("baseline" not in r.details for r in crashed)
    # topk 4 groups: the worker dies on each case; nothing left for a baseline
    assert order.count("baseline") == 2


def test_the_baseline_process_has_no_probe_and_no_specwatch_variables(tmp_path, monkeypatch):
    seen = tmp_path / "env.json"
    monkeypatch.setenv("SPECWATCH_FAULT", "x")
    extra = {**ENV, "PYTHONPATH": f"{PROBE_DIR}{os.pathsep}{ENV['PYTHONPATH']}", "FAKE_BASELINE_ENV": str(seen)}
    run_suite(_suite(tmp_path), tmp_path / "results", _opts(baseline=True, extra_env=extra, max_groups=1))
    got = json.loads(seen.read_text())
    assert not [k for k in got if k.startswith("SPECWATCH_")]
    assert str(PROBE_DIR) not in got["PYTHONPATH"].split(os.pathsep) and HERE in got["PYTHONPATH"]
    assert "SPECWATCH_FAULT" not in baseline_env({"SPECWATCH_PROBE": "0"})


def _rec(tps: float, samples: list[float]):
    r = record(tps=tps)
    r.metrics = {"output_throughput": Metric(value=tps, unit="tokens/s", samples=samples, higher_is_better=True)}
    return r


def test_overhead_is_the_probed_median_over_the_baseline_median_of_run_medians():
    probed = _rec(90.0, [88.0, 90.0, 93.0])
    got = baseline_metrics(probed, [[100.0, 96.0, 104.0], [], [120.0, 118.0, 119.0]])
    base, over = got[BASELINE_THROUGHPUT], got[OVERHEAD]
    assert base.engine_medians == [100.0, 119.0] and base.value == statistics.median([100.0, 119.0])
    assert over.value == pytest.approx(90.0 / 109.5) and over.samples == pytest.approx(
        [88 / 109.5, 90 / 109.5, 93 / 109.5]
    )
    assert overhead_cells(got) == {
        "overhead_probed_spread": pytest.approx(5 / 90),
        "overhead_baseline_spread": pytest.approx(24 / 111),  # over the median of every call
        "overhead_ci_low": None,  # no rounds: the probed side ran one engine start
        "overhead_ci_high": None,
        "overhead_verdict": None,
        "overhead_round_ratios": None,  # no details.baseline: no round known to prefill in full
        "overhead_step_round_ratios": None,  # nor any step time of the plain loop's
        "overhead_rounds_kind": None,  # nor how its rounds ran
    }
    assert baseline_metrics(probed, [[], []]) == {} and overhead_cells(probed.metrics) == {}
    assert overhead_text(probed.metrics) is None


def _rounds(probed: list[float], base: list[float]) -> dict:
    """Metrics of a group that ran ``probed0 baseline0 probed1 ...``: one value per engine start or run."""
    rec = _rec(statistics.median(probed), probed)
    rec.metrics["output_throughput"].engine_medians = probed
    return {**rec.metrics, **baseline_metrics(rec, [[v] for v in base])}


def test_rounds_pair_each_engine_start_with_the_baseline_run_after_it():
    from specwatch.store.baseline import OverheadVerdict, rounds_overhead

    # tiny bs8 on a drifting host (bf707c02b1ca@20261206T182049Z): both sides fell ~28% over the rounds
    drift = rounds_overhead(_rounds([10061.4, 8866.8, 7315.8], [9308.9, 9688.6, 6517.4]))
    assert drift.rounds == 3 and drift.ratio == pytest.approx(1.036, abs=1e-3)
    assert (drift.low, drift.high) == (pytest.approx(0.791, abs=1e-3), pytest.approx(1.356, abs=1e-3))
    assert drift.verdict is OverheadVerdict.unresolved
    # per-round ratios 0.996 +- 0.003: resolved at the target
    steady = _rounds([996.0, 993.0, 999.0], [1000.0, 1000.0, 1000.0])
    assert rounds_overhead(steady).verdict is OverheadVerdict.within
    assert overhead_text(steady).startswith("0.996x (rounds 0.996, 95% CI 0.989-1.003: within 0.98; spread:")
    wide = rounds_overhead(_rounds([996.0, 960.0, 1030.0], [1000.0, 1000.0, 1000.0]))  # 0.98 inside
    assert wide.low < 0.98 < wide.high and wide.verdict is OverheadVerdict.unresolved
    slow = rounds_overhead(_rounds([950.0, 955.0, 948.0], [1000.0, 1001.0, 999.0]))
    assert slow.verdict is OverheadVerdict.past and slow.high < 0.98
    assert overhead_cells(_rounds([950.0, 955.0, 948.0], [1000.0, 1001.0, 999.0]))["overhead_verdict"] == "past"
    # a baseline run that timed nothing leaves the rounds unpaired: no interval, the ratio stays
    assert rounds_overhead(_rounds([996.0, 993.0, 999.0], [1000.0, 1000.0])) is None


def _baseline_record(probed: list[float], runs: list[tuple[list[float], list[int]]], c=None, **prov_kw):
    """A record of a group that ran ``probed0 baseline0 probed1 ...``: probed engine medians and,
    per baseline run, its timed calls' tokens/s and cached prompt tokens (as ``run.baseline`` keeps
    them in ``details.baseline``)."""
    rec = record(c, tps=statistics.median(probed), **prov_kw)
    rec.metrics["output_throughput"].engine_medians = probed
    rec.metrics.update(baseline_metrics(rec, [tps for tps, _ in runs]))
    rec.details.baseline = {
        "order": [f"{kind}{k}" for k in range(len(runs)) for kind in ("probed", "baseline")],
        "runs": [{"round": k, "output_throughput": tps, "cached_tokens": c} for k, (tps, c) in enumerate(runs)],
    }
    return rec


def test_only_rounds_whose_plain_loop_prefilled_in_full_are_pooled_and_they_must_pair():
    from specwatch.store.baseline import prefilled_round_ratios

    full = _baseline_record([990.0, 1000.0], [([1000.0, 990.0, 1010.0], [0, 0, 0]), ([1000.0], [0])])
    assert prefilled_round_ratios(full.metrics, full.details.baseline) == pytest.approx([0.99, 1.0])
    # round 1's plain loop took 64 prompt tokens from the radix cache: less work, its round left out
    cached = _baseline_record([990.0, 1000.0], [([1000.0], [0]), ([1100.0], [0, 64])])
    assert prefilled_round_ratios(cached.metrics, cached.details.baseline) == pytest.approx([0.99])
    unknown = _baseline_record([990.0, 1000.0], [([1000.0], [0]), ([1000.0], [0])])
    unknown.details.baseline["runs"][1].pop("cached_tokens")  # not recorded: not known to prefill in full
    assert prefilled_round_ratios(unknown.metrics, unknown.details.baseline) == pytest.approx([0.99])
    # a run that failed leaves two probed engine starts against one run: no round pairs for sure
    failed = _baseline_record([990.0, 1000.0], [([1000.0], [0]), ([1000.0], [0])])
    failed.details.baseline["runs"][1] = {"round": 1, "error": "baseline process exited with code 1"}
    assert prefilled_round_ratios(failed.metrics, failed.details.baseline) == pytest.approx([0.99])
    shifted = _baseline_record([990.0, 1000.0], [([1000.0], [0]), ([1000.0], [0])])
    shifted.details.baseline["runs"][1]["round"] = 2
    assert prefilled_round_ratios(shifted.metrics, shifted.details.baseline) is None
    short = _baseline_record([990.0, 1000.0, 995.0], [([1000.0], [0]), ([1000.0], [0])])
    assert prefilled_round_ratios(short.metrics, short.details.baseline) is None
    assert prefilled_round_ratios(_rec(90.0, [90.0]).metrics, None) is None


def test_the_step_clock_pairs_each_probed_engines_fast_step_with_its_rounds_plain_loop():
    from specwatch.analysis.overhead import baseline_overhead_table
    from specwatch.store.baseline import STEP_CLOCK, step_round_ratios
    from specwatch.store.frame import records_frame

    def with_steps(rec, probed_ms, plain_ms):
        rec.metrics[STEP_CLOCK] = Metric(value=statistics.median(probed_ms), unit="ms", engine_medians=probed_ms)
        for run, ms in zip(rec.details.baseline["runs"], plain_ms):
            if ms is not None:
                run["sglang_step_times"] = {STEP_CLOCK: ms, "sglang_step_time": ms * 1.2}
        return rec

    # the plain loop's fast steps 2.0 ms, the probed engine's 2.01-2.02: 0.5-1% slower per step
    three = _baseline_record([990.0, 1000.0, 995.0], [([1000.0], [0])] * 3, run_id="run0")
    rec = with_steps(three, [2.02, 2.01, 2.02], [2.0] * 3)
    assert step_round_ratios(rec.metrics, rec.details.baseline) == pytest.approx([2 / 2.02, 2 / 2.01, 2 / 2.02])
    slower = with_steps(_baseline_record([990.0, 1000.0], [([1000.0], [0])] * 2, run_id="run2"), [2.1, 2.0], [2.0] * 2)
    (row,) = baseline_overhead_table(records_frame([slower])).to_dict("records")
    assert row["step clock p10 plain / probed"] == "0.976 (0.716-1.331, unresolved; 263 rounds to resolve)"
    gap = with_steps(_baseline_record([990.0, 1000.0], [([1000.0], [0])] * 2), [2.02, 2.01], [2.0, None])
    assert step_round_ratios(gap.metrics, gap.details.baseline) == pytest.approx([2 / 2.02])  # round 1 unrecorded
    short = with_steps(_baseline_record([990.0, 1000.0], [([1000.0], [0])] * 2), [2.02], [2.0, 2.0])
    assert step_round_ratios(short.metrics, short.details.baseline) is None  # the rounds do not pair
    plain = _baseline_record([990.0, 1000.0], [([1000.0], [0])] * 2, run_id="run1")
    assert step_round_ratios(plain.metrics, plain.details.baseline) is None
    (row,) = baseline_overhead_table(records_frame([rec])).to_dict("records")
    assert row["step clock p10 plain / probed"] == "0.992 (0.985-0.999, within)"  # t interval, 2 df
    assert "; step clock 0.992, 95% CI 0.985-0.999: within 0.98; spread" in overhead_text(
        rec.metrics, rec.details.baseline
    )
    (row,) = baseline_overhead_table(records_frame([plain])).to_dict("records")
    assert row["step clock p10 plain / probed"] == "not recorded"


def test_a_baseline_runs_entry_keeps_its_step_clock_and_the_spec_asks_for_it_with_the_suites_step_times(
    tmp_path, monkeypatch
):
    from specwatch.run import baseline as run_baseline_mod

    line = BaselineLine(
        case_id="c",
        output_throughput=[1.0],
        sglang_step_times={"sglang_step_time_p10": 2.0},
        sglang_step_distribution={"p10": 2.0, "slow_share": 0.1},
    )
    entry = run_baseline_mod._run_entry(3, line, None)
    assert entry["round"] == 3 and entry["sglang_step_times"] == {"sglang_step_time_p10": 2.0}
    assert entry["sglang_step_distribution"] == {"p10": 2.0, "slow_share": 0.1}
    assert "sglang_step_times_error" not in entry
    seen = []
    suite = harness_suite(tmp_path, header="step_times = true")
    job = SimpleNamespace(suite=suite, timeout_s=10)
    monkeypatch.setattr(
        run_baseline_mod, "run_baseline", lambda spec, *a: seen.append(spec) or run_baseline_mod.BaselineRun()
    )
    run_baseline_mod.launch(job, _opts(), [p.case for p in suite.plan()][:1], 0)
    assert seen[0].step_times is True


def test_a_records_own_interval_leaves_out_the_rounds_whose_plain_loop_read_the_cache():
    from specwatch.store.baseline import prefilled_round_ratios, rounds_interval, rounds_overhead

    # round 1's plain loop took 64 prompt tokens from the radix cache and ran faster (less prefill)
    rec = _baseline_record([990.0, 995.0, 1000.0], [([1000.0], [0]), ([1300.0], [0, 64]), ([1000.0], [0])])
    prefilled = rounds_interval(prefilled_round_ratios(rec.metrics, rec.details.baseline))
    own = rounds_overhead(rec.metrics, rec.details.baseline)
    assert (own.rounds, own.ratio) == (2, prefilled.ratio) and own.ratio == pytest.approx(0.995, abs=1e-3)
    assert rounds_overhead(rec.metrics).rounds == 3  # the metrics alone: every paired round
    cells = overhead_cells(rec.metrics, rec.details.baseline)
    assert (cells["overhead_ci_low"], cells["overhead_ci_high"]) == (own.low, own.high)
    assert overhead_text(rec.metrics, rec.details.baseline).startswith(
        f"{rec.metrics[OVERHEAD].value:.3f}x ({own.text()}"
    )


def test_the_overhead_table_pools_every_runs_rounds_per_case_and_resolves_what_one_run_cannot():
    from specwatch.analysis.overhead import baseline_overhead_table
    from specwatch.store.baseline import rounds_interval
    from specwatch.store.frame import records_frame

    # three runs of one case, three rounds each, ratios 0.99-1.01: each run's interval holds 0.98
    runs = [[0.99, 1.01, 0.985], [1.005, 0.995, 0.99], [1.0, 0.985, 1.01]]
    recs = [
        _baseline_record([1000.0 * r for r in ratios], [([1000.0], [0])] * 3, run_id=f"run{i}")
        for i, ratios in enumerate(runs)
    ]
    assert all(rounds_interval(ratios).verdict.value == "unresolved" for ratios in runs)
    for rec, cost in zip(recs, (20.0, 22.0, 30.0)):  # the probe's own clock: µs per batch, 4 ms steps
        rec.metrics["probe_time_per_batch"] = Metric(value=cost, unit="us", higher_is_better=False)
        rec.metrics["step_time"] = Metric(value=4.0, unit="ms", higher_is_better=False)
    other = _baseline_record([900.0, 905.0], [([1000.0], [0]), ([1000.0], [0])], c=case(batch_size=8), run_id="run9")
    faulty = _baseline_record(
        [500.0, 500.0], [([1000.0], [0]), ([1000.0], [0])], run_id="run8", fault="slow-verify-0us"
    )
    t = baseline_overhead_table(records_frame([*recs, other, faulty]))
    assert len(t) == 2  # the fault record is no harness overhead
    row = t.iloc[0]
    pooled = rounds_interval([r for ratios in runs for r in ratios])
    assert (row["runs"], row["rounds"], row["run ids"]) == (3, 9, "run0, run1, run2")
    assert row["95% CI"] == f"{pooled.low:.3f}-{pooled.high:.3f}" and pooled.low >= 0.98
    assert row["verdict vs 0.98"] == "within" and row["probed / plain loop"] == pytest.approx(0.997, abs=1e-3)
    assert (t.iloc[1]["rounds"], t.iloc[1]["verdict vs 0.98"]) == (2, "past")
    assert row["rounds to resolve"] == t.iloc[1]["rounds to resolve"] == "–"  # both resolved
    assert (row["probe per step"], t.iloc[1]["probe per step"]) == ("0.55%", "not recorded")  # 22 µs / 4 ms
    one = baseline_overhead_table(records_frame(recs[:1])).iloc[0]  # one run's three rounds: unresolved
    assert one["verdict vs 0.98"] == "unresolved" and 3 < int(one["rounds to resolve"]) <= 9


def test_paired_and_lockstep_rounds_pool_apart_from_sequential_rounds_of_the_same_case():
    from specwatch.analysis.overhead import baseline_overhead_table
    from specwatch.store.baseline import RoundsKind, rounds_kind
    from specwatch.store.frame import records_frame

    sequential = _baseline_record([800.0, 1200.0], [([1000.0], [0]), ([1000.0], [0])], run_id="run0")
    paired = _baseline_record([990.0, 995.0, 1000.0], [([1000.0], [0])] * 3, run_id="run1")
    paired.details.baseline["order"] = ["paired0", "paired1", "paired2"]
    assert rounds_kind(sequential.details.baseline) is RoundsKind.sequential
    assert rounds_kind(paired.details.baseline) is RoundsKind.paired and rounds_kind(None) is None
    unnamed = {**paired.details.baseline, "order": ["probed0", "pairedness"]}  # a label naming no step is none
    assert rounds_kind(unnamed) is RoundsKind.sequential
    lockstep = _baseline_record([990.0, 1000.0], [([1000.0], [0])] * 2, run_id="run2")
    lockstep.details.baseline["order"] = ["paired0", "paired1"]
    for run in lockstep.details.baseline["runs"]:  # the plain loop's windows ended with the probed ones
        run["windows_stopped_by"] = "lead"
    assert rounds_kind(lockstep.details.baseline) is RoundsKind.lockstep
    t = baseline_overhead_table(records_frame([sequential, paired, lockstep]))
    got = {r["taken"]: (r["rounds"], r["run ids"]) for r in t.to_dict("records")}
    assert got == {"sequential": (2, "run0"), "paired": (3, "run1"), "lockstep": (2, "run2")}
    # a frame without the column (records from before it) reads its rounds as sequential
    df = records_frame([paired]).drop(columns=["overhead_rounds_kind"])
    assert baseline_overhead_table(df).iloc[0]["taken"] == "sequential"


def test_the_overhead_command_shows_pooled_rounds_and_exits_1_where_a_case_is_past(tmp_path, monkeypatch, capsys):
    from typer.testing import CliRunner

    from specwatch.cli import app
    from specwatch.store.jsonl import append_record

    root = tmp_path / "results" / "m" / "sglang-0.5.17"
    root.mkdir(parents=True)
    for i in range(2):
        rec = _baseline_record([950.0, 952.0, 949.0], [([1000.0], [0])] * 3, run_id=f"run{i}")
        append_record(root / "timing.jsonl", rec)
    got = CliRunner().invoke(app, ["overhead", "--results", str(tmp_path / "results")])
    assert got.exit_code == 1, got.output
    assert "harness overhead against the plain loop" in got.output
    assert "0 within, 1 past, 0 unresolved" in got.output


@pytest.mark.parametrize(
    "kw,words",
    [
        (dict(bare=True), "drop --bare"),
        (dict(faults=("x",)), "drop --fault"),
        (dict(parallel_starts=2), "drop --parallel-starts"),
        (dict(executor="gpus"), "--executor local"),
    ],
)
def test_baseline_with_an_option_it_cannot_go_with_is_refused(kw, words):
    with pytest.raises(ValueError, match=words):
        check_baseline(RunOptions(baseline=True, **kw))
    check_baseline(RunOptions(**kw))  # without --baseline: nothing to refuse


@pytest.mark.parametrize(
    "more", [["--parallel-starts", "2"], ["--bare"], ["--fault", "none", "--fault", "row-widen-revert"]]
)
def test_the_cli_refuses_a_bad_combination_in_one_line_exit_2(tmp_path, monkeypatch, capsys, more):
    import specwatch.commands.run as run_cmd
    from specwatch.cli import main as cli_main

    monkeypatch.setattr(run_cmd, "_cuda_available", lambda: True)
    p = harness_suite(tmp_path).path
    with pytest.raises(SystemExit) as e:
        cli_main(["run", str(p), "--baseline", *more, "--results", str(tmp_path / "res")])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert ("--bare" if "--bare" in more else "--baseline") in err
    assert not (tmp_path / "res").exists()


def _pair(tmp_path, head_overhead: bool):
    from specwatch.analysis.compare import compare_records
    from specwatch.analysis.compare_report import markdown

    def rec(tps):
        return _rec(tps, [tps - 1, tps, tps + 1])

    head = rec(90.0)
    if head_overhead:
        head.metrics = {**head.metrics, **baseline_metrics(head, [[100.0, 99.0, 101.0]])}
    return markdown(compare_records([rec(90.0)], [head]), "base", "head", show_unchanged=True)


def test_compare_reports_an_overhead_column_only_where_the_head_has_one(tmp_path):
    with_col, without = _pair(tmp_path, True), _pair(tmp_path, False)
    assert "| overhead |" in with_col and "0.900x (spread: probed 2.2%, baseline 2.0%)" in with_col
    assert "overhead" not in without


def test_compare_tests_two_overheads_round_by_round_where_their_rounds_pair():
    """Two records' overheads are tested over their per-round ratios (Welch t, rounds 1.08 / 0.92 /
    1.12 against 1.00 / 1.01 / 0.99: unchanged) where their rounds pair; over the repeats (probed
    repeats over one baseline value, which move with the host) only where they do not."""
    from specwatch.analysis.compare import compare_records
    from specwatch.analysis.engine_test import TimedTest

    def drifting(probed, base, spread):
        rec = _rec(statistics.median(probed), [v * (1 + d) for v in probed for d in spread])
        rec.metrics["output_throughput"].engine_medians = probed
        rec.metrics = {**rec.metrics, **baseline_metrics(rec, [[v] for v in base])}
        return rec

    base = drifting([10800.0, 9200.0, 11200.0], [10000.0] * 3, (-0.01, 0.0, 0.01))
    head = drifting([8000.0, 8080.0, 7920.0], [8000.0] * 3, (-0.01, 0.0, 0.01))
    (row,) = [r for r in compare_records([base], [head]) if r.metric == "overhead"]
    assert row.test is TimedTest.engine_medians and row.verdict.value == "unchanged", row.note
    assert "3 vs 3 engine medians" in row.note
    unpaired = head.model_copy(deep=True)
    unpaired.metrics["baseline_output_throughput"].engine_medians = None  # one baseline run: no rounds
    (row,) = [r for r in compare_records([base], [unpaired]) if r.metric == "overhead"]
    assert row.test is TimedTest.repeats


def test_the_dashboard_case_table_shows_overhead_only_where_records_carry_it():
    from specwatch.present.dashboard import cases_table
    from specwatch.store.frame import records_frame

    plain = _rec(90.0, [89.0, 91.0])
    assert "overhead" not in cases_table(records_frame([plain])).columns
    probed = plain.model_copy(deep=True)
    probed.metrics = {**probed.metrics, **baseline_metrics(probed, [[100.0, 102.0]])}
    cols = cases_table(records_frame([probed])).columns
    assert cols[cols.index("overhead") : cols.index("overhead") + 3] == [
        "overhead",
        "overhead_probed_spread",
        "overhead_baseline_spread",
    ]


def _worker_line(worker_baseline, tmp_path, case, name: str, **spec_kw) -> BaselineLine:
    """``worker.baseline.main`` on a spec of ``case`` alone (two repeats, ``spec_kw`` beside) and the
    one line it writes."""
    spec, out = tmp_path / f"spec-{name}.json", tmp_path / f"out-{name}.jsonl"
    kw = {"repeats": 2, **spec_kw}
    spec.write_text(BaselineSpec(cases=[case], models_dir=str(tmp_path), results=str(out), **kw).model_dump_json())
    assert worker_baseline.main(str(spec)) == 0
    (line,) = [BaselineLine.model_validate_json(x) for x in out.read_text().splitlines()]
    return line


def test_the_baseline_worker_writes_a_line_per_case_on_a_fake_engine(tmp_path, monkeypatch):
    from specwatch.worker import baseline as worker_baseline
    from test_engine_worker import CASE, FakeEngine

    class Engine(FakeEngine):
        def shutdown(self):
            self.shut = True

    case = CASE.model_copy(update={"batch_size": 4, "input_len": 40, "output_len": 16})
    monkeypatch.setattr(worker_baseline, "start_engine", lambda cases, models_dir, steps: (Engine(cases[0]), None))
    spec = tmp_path / "spec.json"
    out = tmp_path / "out.jsonl"
    spec.write_text(BaselineSpec(cases=[case], repeats=2, models_dir=str(tmp_path), results=str(out)).model_dump_json())
    assert worker_baseline.main(str(spec)) == 0
    (line,) = [BaselineLine.model_validate_json(x) for x in out.read_text().splitlines()]
    assert line.ok and line.case_id == case.case_id and len(line.output_throughput) == 2
    assert line.flushed_output_throughput is None and line.finished_at >= line.started_at

    # started by the runner (pipe end and runner pid on its command line): it arms the lifeline
    from specwatch.core import lifeline

    armed = []
    monkeypatch.setattr(lifeline, "hold", lambda *args: armed.append(args))
    assert worker_baseline.main(str(spec), "7", "4242") == 0
    assert armed == [(None, 7, 4242)]

    # the suite's step_times: the engine starts with SGLang's recording, each line has its window
    from specwatch.rules.release_step_times import step_time_source
    from specwatch.worker.step_times import StepWindow
    from test_timing_noise import SteppingEngine

    asked = []

    def stepping(cases, models_dir, steps):
        asked.append(steps)
        eng = SteppingEngine(cases[0])
        eng.shutdown = lambda: None
        return eng, lambda: StepWindow(eng, "0.5.17", step_time_source("0.5.17"))

    monkeypatch.setattr(worker_baseline, "start_engine", stepping)
    line = _worker_line(worker_baseline, tmp_path, case, "steps", step_times=True)
    assert asked == [True] and line.sglang_step_times["sglang_step_time_p10"] >= 4.0


def test_with_windows_each_baseline_repeat_holds_min_timed_s_of_calls_until_the_ci_target(tmp_path, monkeypatch):
    """As the probed run's repeats: calls back to back on fresh prompts until their wall time adds
    up to ``min_timed_s``, then repeats until the CI target; a repeat's tokens/s is its tokens over
    its calls' wall time."""
    from specwatch.worker import baseline as worker_baseline
    from test_engine_worker import CASE, FakeEngine

    clock = {"t": 0.0, "call": 0}
    walls = [0.3, 0.3, 0.3, 0.3, 0.5, 0.5, 0.6, 0.4, 0.4, 0.4]  # seconds per timed call

    class Engine(FakeEngine):
        def generate(self, input_ids, sampling_params):
            outs = super().generate(input_ids, sampling_params)
            if sampling_params.get("max_new_tokens") == self.case.output_len:  # not a prefill-only refill
                if clock["call"] >= 1:  # the first full call is the warm-up
                    clock["t"] += walls[(clock["call"] - 1) % len(walls)]
                clock["call"] += 1
            return outs

        def shutdown(self):
            pass

    case = CASE.model_copy(update={"batch_size": 2, "input_len": 40, "output_len": 16})
    monkeypatch.setattr(worker_baseline, "start_engine", lambda cases, models_dir, steps: (Engine(cases[0]), None))
    monkeypatch.setattr(worker_baseline.time, "perf_counter", lambda: clock["t"])
    spec, out = tmp_path / "spec.json", tmp_path / "out.jsonl"
    spec.write_text(
        BaselineSpec(
            cases=[case], repeats=2, models_dir=str(tmp_path), results=str(out), min_timed_s=1.0, ci_half_width=0.9
        ).model_dump_json()
    )
    assert worker_baseline.main(str(spec)) == 0
    (line,) = [BaselineLine.model_validate_json(x) for x in out.read_text().splitlines()]
    assert line.ok and line.batches_per_repeat == [4, 2]  # 4 x 0.3 s, then 0.5 + 0.5 s
    tokens = 2 * 16
    assert line.output_throughput == pytest.approx([4 * tokens / 1.2, 2 * tokens / 1.0])


@pytest.mark.parametrize("windows", [False, True])
def test_every_timed_baseline_call_prefills_in_full_as_the_probed_batch_does(tmp_path, monkeypatch, windows):
    """Timed calls back to back on the tiny oracle's few chain starts would be served partly from
    the radix cache; each is readied by a flush and, where the pool holds it, an untimed refill on
    other starts, so the plain loop prefills what the probed run prefills."""
    from specwatch.worker import baseline as worker_baseline
    from test_engine_worker import CASE, FakeEngine

    calls = []

    class Engine(FakeEngine):
        def generate(self, input_ids, sampling_params):
            calls.append(("generate", sampling_params["max_new_tokens"], [p[0] for p in input_ids]))
            return super().generate(input_ids, sampling_params)

        def flush_cache(self):
            calls.append(("flush",))
            self.cache.clear()
            return True

        def shutdown(self):
            pass

    case = CASE.model_copy(update={"batch_size": 16, "input_len": 128, "output_len": 16})
    monkeypatch.setattr(worker_baseline, "start_engine", lambda cases, models_dir, steps: (Engine(cases[0]), None))
    spec, out = tmp_path / "spec.json", tmp_path / "out.jsonl"
    timing = {"min_timed_s": 1e-9, "ci_half_width": 0.01, "max_repeats": 4} if windows else {}
    spec.write_text(
        BaselineSpec(cases=[case], repeats=4, models_dir=str(tmp_path), results=str(out), **timing).model_dump_json()
    )
    assert worker_baseline.main(str(spec)) == 0
    (line,) = [BaselineLine.model_validate_json(x) for x in out.read_text().splitlines()]
    assert line.ok and len(line.cached_tokens) == 4 and line.cached_tokens == [0, 0, 0, 0]
    timed = [i for i, c in enumerate(calls) if c[0] == "generate" and c[1] == case.output_len][1:]  # after the warm-up
    assert len(timed) == 4
    for i in timed:  # flush, refill prefill-only batch on starts disjoint from the timed ones, timed call
        assert calls[i - 2] == ("flush",) and calls[i - 1][:2] == ("generate", 1)
        assert not set(calls[i - 1][2]) & set(calls[i][2])

    # the same loop without the flush and refill reads prompt tokens from the cache
    from specwatch.oracle.prompts import timed_tag

    monkeypatch.setattr(worker_baseline, "fresh_batch", lambda engine, prompts, sp, r: prompts.batch(timed_tag(r))[0])
    out.unlink()
    assert worker_baseline.main(str(spec)) == 0
    (line,) = [BaselineLine.model_validate_json(x) for x in out.read_text().splitlines()]
    assert sum(line.cached_tokens) > 0


def test_the_runner_gives_the_baseline_the_suites_windows_and_ci_target(tmp_path, monkeypatch):
    import specwatch.run.baseline as run_baseline
    from specwatch.run.baseline import BaselineRun, launch

    suite = _suite(tmp_path, "min_timed_s = 2.0\nci_half_width = 0.01\nmax_repeats = 12")
    seen = []
    monkeypatch.setattr(run_baseline, "run_baseline", lambda spec, *a, **k: seen.append(spec) or BaselineRun())
    _, jobs = plan_run(suite, None, tmp_path / "results", dict(host_facts(), gpu_count=1), _opts(baseline=True))
    job = jobs[0]
    launch(job, _opts(baseline=True), job.cases, 0)
    assert (seen[0].repeats, seen[0].min_timed_s, seen[0].ci_half_width, seen[0].max_repeats) == (3, 2.0, 0.01, 12)
    assert seen[0].pin_cores is False
    pinned = _suite(tmp_path, "pin_cores = true")
    _, jobs = plan_run(pinned, None, tmp_path / "results", dict(host_facts(), gpu_count=1), _opts(baseline=True))
    launch(jobs[0], _opts(baseline=True), jobs[0].cases, 0)
    assert seen[1].pin_cores is True


def test_with_pin_cores_the_baseline_pins_after_the_engine_starts_and_each_line_says_where(tmp_path, monkeypatch):
    """The probed worker pins SGLang's processes and itself; the plain loop it is compared with
    runs on the same layout, and its runs in ``details.baseline`` say what was pinned."""
    from specwatch.run.baseline import _run_entry
    from specwatch.worker import baseline as worker_baseline
    from specwatch.worker import pinning
    from test_engine_worker import CASE, FakeEngine

    events = []

    class Engine(FakeEngine):
        def shutdown(self):
            pass

    def started(cases, models_dir, steps):
        events.append("engine")
        return Engine(cases[0]), None

    layout = {"pinned": True, "processes": [{"pid": 1, "role": "scheduler", "cpus": [1, 2]}], "allowed_cpus": [0, 1, 2]}
    monkeypatch.setattr(worker_baseline, "start_engine", started)
    monkeypatch.setattr(pinning, "pin_cores", lambda: events.append("pin") or layout)
    case = CASE.model_copy(update={"batch_size": 2, "input_len": 40, "output_len": 16})
    for pin, want in ((False, None), (True, layout)):
        events.clear()
        line = _worker_line(worker_baseline, tmp_path, case, str(pin), pin_cores=pin)
        assert line.core_pinning == want and events == (["engine", "pin"] if pin else ["engine"])
        assert ("core_pinning" in _run_entry(0, line, None)) is pin


@pytest.mark.gpu
def test_the_baseline_worker_times_the_tiny_oracle_on_a_gpu(tmp_path):
    from specwatch.run.baseline import run_baseline

    case = _suite(tmp_path).plan()[0].case.model_copy(update={"batch_size": 16})
    assert case.algorithm is Algorithm.EAGLE
    spec = BaselineSpec(cases=[case], repeats=4, models_dir="/tmp/specwatch-models", results=str(tmp_path / "o.jsonl"))
    run = run_baseline(spec, "specwatch.worker.baseline", baseline_env(None), 600, tmp_path / "log.txt")
    line = run.lines[case.case_id]
    assert run.error is None and len(line.output_throughput) == 4
    assert line.cached_tokens == [0, 0, 0, 0]  # 64 prompts from the oracle's 256 starts: every call prefills in full


def test_a_run_interrupted_during_a_baseline_still_appends_the_probed_records(tmp_path, monkeypatch):
    """The probed records wait for the group's baseline runs; stopped in the first one (Ctrl-C), the
    group's ok records are appended anyway, without a baseline."""
    import specwatch.run.baseline as run_baseline

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(run_baseline, "launch", interrupted)
    root = tmp_path / "results"
    with pytest.raises(KeyboardInterrupt):
        run_suite(_suite(tmp_path), root, _opts(baseline=True, extra_env=ENV))
    recs = [r for f in root.rglob("*.jsonl") for r in read_records(f)]
    assert len(recs) == 2 and all(r.status is Status.ok for r in recs)
    assert all(OVERHEAD not in r.metrics and r.details.baseline["order"] == ["probed0"] for r in recs)


def test_a_baseline_process_is_gone_within_seconds_of_its_runner_being_sigkilled(tmp_path):
    """The baseline carries the worker's lifeline (pipe end and runner pid on its command line, its
    environment free of specwatch variables): a SIGKILLed runner leaves no engine behind."""
    import signal

    from test_wire import _alive, _gone_within

    runner, pid_file = _runner_in_a_hung_baseline(tmp_path, max_groups=1)
    baseline = int(pid_file.read_text())
    assert _alive(baseline)
    runner.send_signal(signal.SIGKILL)
    runner.wait()
    assert not _gone_within([baseline], 3), "a baseline outlived its SIGKILLed runner"


def test_a_run_stopped_by_sigterm_during_a_baseline_appends_the_probed_records_and_counts_them(tmp_path):
    """SIGTERM exits from its handler, where no ``finally`` runs: the probed records held for the
    group's baseline are appended there, before the run's summary, which counts them."""
    import signal

    from specwatch.store.jsonl import RUNS_FILE, read_runs

    runner, _ = _runner_in_a_hung_baseline(tmp_path, max_groups=None)
    runner.send_signal(signal.SIGTERM)
    runner.send_signal(signal.SIGTERM)  # as `timeout` forwards its own: acted on once
    assert runner.wait(timeout=60) == 128 + signal.SIGTERM
    recs = [r for f in (tmp_path / "results").rglob("*.jsonl") for r in read_records(f)]
    assert len(recs) == 2 and all(r.status is Status.ok and OVERHEAD not in r.metrics for r in recs)
    (run,) = read_runs(next((tmp_path / "results").rglob(RUNS_FILE)))
    assert run.stopped_by == "SIGTERM" and run.records == {"ok": 2}
    assert list((tmp_path / "tmp").iterdir()) == []  # the stopped runner removed its plain loop's folder


def _runner_in_a_hung_baseline(tmp_path, max_groups):
    """A runner process on ``_suite`` with ``--baseline`` whose first baseline hangs (its lifeline
    armed, its pid written): returned once that baseline runs, with the pid file."""
    import subprocess
    import sys
    import time

    _suite(tmp_path)
    pid_file = tmp_path / "baseline.pid"
    script = f"""
import os, sys
sys.path.insert(0, {HERE!r})
from specwatch.run.runner import RunOptions, run_suite
from specwatch.suite import load_suite
run_suite(load_suite({str(tmp_path / "b.toml")!r}), {str(tmp_path / "results")!r}, RunOptions(gpus=1,
          worker_module="fake_worker", baseline_module="fake_baseline", baseline=True, max_groups={max_groups!r},
          extra_env={{"PYTHONPATH": {HERE!r} + os.pathsep + os.environ.get("PYTHONPATH", ""),
                      "FAKE_BASELINE_HANG": {str(pid_file)!r}}}))
"""
    runner = subprocess.Popen([sys.executable, "-c", script], env=own_tmpdir_env(tmp_path))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (pid_file.exists() and pid_file.read_text()):
        time.sleep(0.1)
    return runner, pid_file


def test_rounds_to_resolve_is_the_fewest_rounds_whose_interval_clears_the_target_at_this_spread():
    import math

    from scipy.stats import t

    from specwatch.store.baseline import MAX_ROUNDS_SHOWN, rounds_interval, rounds_to_resolve

    ratios = [0.99, 1.01, 0.985]  # mean 0.995, its interval holds 0.98
    assert rounds_interval(ratios).verdict.value == "unresolved"
    n = rounds_to_resolve(ratios)
    logs = [math.log(r) for r in ratios]
    gap, sd = statistics.fmean(logs) - math.log(0.98), statistics.stdev(logs)
    assert t.ppf(0.975, n - 1) * sd / math.sqrt(n) < gap <= t.ppf(0.975, n - 2) * sd / math.sqrt(n - 1)
    assert 3 < n < 20
    # below the target resolves too (as past); a mean on the target never does
    assert rounds_to_resolve([0.90, 0.95, 0.92]) is not None
    assert rounds_to_resolve([0.97, 0.99, 0.98 * 0.98 / (0.97 * 0.99) * 0.98]) is None
    assert rounds_to_resolve([1.0]) is None and MAX_ROUNDS_SHOWN == 1000


def test_a_paired_baseline_runs_beside_each_engine_start_taking_turns_unit_by_unit(tmp_path):
    """``--baseline --paired``: in every round the plain loop's process runs while the probed worker
    does, the two taking turns (``core.turns``): no two units overlap, and they alternate but at a
    round's start (the first turn the probed worker's on even rounds, the plain loop's on odd)."""
    log = tmp_path / "turns.log"
    suite = _suite(tmp_path, "engine_starts = 2")
    env = {**ENV, "FAKE_TURN_UNITS": "2", "FAKE_TURNS_LOG": str(log)}
    out = run_suite(suite, tmp_path / "results", _opts(baseline=True, paired=True, extra_env=env))
    recs = list(read_records(out))
    assert len(recs) == 8 and all(r.status is Status.ok for r in recs)
    spec = [r for r in recs if measures_baseline(r.case)]
    assert spec and all(r.details.baseline["order"] == ["paired0", "paired1"] for r in spec)
    assert all(OVERHEAD in r.metrics and len(r.details.baseline["runs"]) == 2 for r in spec)
    lines = [line.split() for line in log.read_text().splitlines()]
    assert {(kind.split(":")[0], side) for kind, _, _, _, side in lines} == {("probed", "a"), ("baseline", "b")}
    units = sorted((float(t0), float(t1), kind) for kind, _, t0, t1, _ in lines)  # the probed side leads
    assert len(units) == 4 * 2 * 2 * 2 * 2  # groups x rounds x cases x units x loops
    assert all(a[1] <= b[0] for a, b in zip(units, units[1:]))  # never two at once
    repeats = sum(a[2] == b[2] for a, b in zip(units, units[1:]))
    assert repeats <= 4 * 2  # a turn kept only across a round's start


def test_paired_needs_the_baseline():
    with pytest.raises(ValueError, match="--paired"):
        check_baseline(_opts(paired=True))
