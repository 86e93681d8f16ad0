"""Less timing noise at the source, on fake engines: several engine starts per case (and compare's test
on their medians), timed windows with a CI target, SGLang's own step times, core pinning."""

import json
import os
import sys
import types
from pathlib import Path

import pytest

from conftest import harness_suite
from records import record
from specwatch.analysis.compare import compare_records, compare_specs
from specwatch.analysis.compare_report import markdown
from specwatch.analysis.engine_test import TimedTest
from specwatch.analysis.noise import noise_report
from specwatch.core.errors import SpecwatchInputError
from specwatch.core.record import Metric, Status
from specwatch.rules.release_step_times import STEP_TIME_SOURCES, step_time_source
from specwatch.run.engine_starts import AGREE_CHECK, merge_records
from specwatch.run.group import worker_timing
from specwatch.run.runner import RunOptions, run_suite
from specwatch.store.jsonl import append_record, read_records, results_path
from specwatch.suite import load_suite
from specwatch.worker import pinning, step_times
from specwatch.worker.measure import run_case
from specwatch.worker.windows import RepeatPlan, median_ci_half_width
from test_engine_worker import CASE, FakeEngine, _timed_engine

HERE = os.path.dirname(__file__)
SGLANG_SRC = Path(__file__).resolve().parents[1] / ".cache" / "sglang-src"


def _suite(tmp_path, header="", topks="[1, 4]"):
    return harness_suite(tmp_path, topks=topks, header=header)


def _run(tmp_path, suite):
    starts = tmp_path / "starts"
    env = {"PYTHONPATH": HERE + os.pathsep + os.environ.get("PYTHONPATH", ""), "FAKE_WORKER_STARTS": str(starts)}
    out = run_suite(suite, tmp_path / "results", RunOptions(gpus=1, worker_module="fake_worker", extra_env=env))
    return list(read_records(out)), starts.read_text().count("start")


# -- engine starts --------------------------------------------------------------------------------


def test_each_engine_start_is_a_fresh_worker_and_each_case_gets_one_record_with_every_engines_median(tmp_path):
    recs, starts = _run(tmp_path, _suite(tmp_path, "engine_starts = 3", topks="[1]"))
    assert starts == 2 * 3  # two engine groups (page 1, page 64), three starts each
    assert len(recs) == 4 and all(r.status is Status.ok for r in recs)
    m = recs[0].metrics["output_throughput"]
    assert m.engine_medians == [m.value] * 3 and recs[0].details["engine_starts"]["ran"] == 3
    assert len(recs[0].details["engine_starts"]["engines"]) == 3 and recs[0].checks[AGREE_CHECK]


def test_engine_starts_given_to_run_replace_the_suites_own_and_keep_its_name_and_hash(tmp_path):
    from specwatch.commands.options import load_suite_file

    plain = _suite(tmp_path, "engine_starts = 2", topks="[1]")
    suite = load_suite_file(plain.path, engine_starts=3)
    assert (suite.name, suite.sha256, suite.spec.suite.speedup) == (plain.name, plain.sha256, plain.spec.suite.speedup)
    assert plain.spec.suite.engine_starts == 2  # the file's own value, left as it was
    recs, starts = _run(tmp_path, suite)
    assert starts == 2 * 3 and {r.details["engine_starts"]["ran"] for r in recs} == {3}


def test_a_case_that_crashes_on_an_engine_start_is_recorded_once_and_not_run_again(tmp_path):
    recs, starts = _run(tmp_path, _suite(tmp_path, "engine_starts = 2"))
    crashed = [r for r in recs if r.status is Status.crashed]
    assert len(recs) == 8 and len(crashed) == 4 and all(r.case.topk == 4 for r in crashed)
    assert all(r.details["engine_starts"]["not_ok_on"] == 1 for r in crashed)
    ok = [r for r in recs if r.status is Status.ok]
    assert all(len(r.metrics["output_throughput"].engine_medians) == 2 for r in ok)
    # chain groups: 2 starts each; tree groups: start 1 and a fresh worker after each crash, start 2
    # runs only what has not crashed (nothing left of a tree group: no start)
    assert starts == 2 * 2 + 2 * 2


def test_one_engine_start_writes_records_as_before(tmp_path):
    recs, starts = _run(tmp_path, _suite(tmp_path, topks="[1]"))
    assert starts == 2 and "engine_starts" not in recs[0].details
    assert "engine_medians" not in recs[0].model_dump_json()


def test_merging_engines_takes_the_median_of_medians_and_flags_exact_metrics_that_disagree():
    def one(tps, leaked):
        r = record(tps=tps)
        r.metrics["output_throughput"] = Metric(value=tps, unit="tokens/s", samples=[tps - 1, tps + 1])
        r.metrics["leaked_tokens"] = Metric(value=leaked, unit="tokens", exact=True, higher_is_better=False)
        return r

    merged = merge_records([one(600.0, 0), one(970.0, 0), one(640.0, 64)], planned=3)
    tps = merged.metrics["output_throughput"]
    assert tps.value == 640.0 and tps.engine_medians == [600.0, 970.0, 640.0] and len(tps.samples) == 6
    assert merged.metrics["leaked_tokens"].value == 64 and merged.checks[AGREE_CHECK] is False


# -- compare on engine medians --------------------------------------------------------------------


def _engines(medians, spread=2.0):
    r = record(tps=sorted(medians)[len(medians) // 2])
    samples = [x + d for x in medians for d in (-spread, 0.0, spread)]
    r.metrics["output_throughput"] = Metric(
        value=r.metrics["output_throughput"].value,
        unit="tokens/s",
        samples=samples,
        higher_is_better=True,
        engine_medians=list(medians),
    )
    return r


def test_compare_tests_engine_medians_when_both_sides_ran_several_engines():
    # pooled repeats of one lucky engine per side look significant; the engines do not
    base, head = _engines([700.0, 960.0, 640.0]), _engines([800.0, 650.0, 900.0])
    row = next(r for r in compare_records([base], [head]) if r.metric == "output_throughput")
    assert row.test is TimedTest.engine_medians and "Welch t, 3 vs 3 engine medians" in row.note
    assert row.verdict.value == "unchanged"
    slow = _engines([500.0, 505.0, 498.0])
    row = next(r for r in compare_records([_engines([700.0, 705.0, 698.0])], [slow]) if r.metric == "output_throughput")
    assert row.test is TimedTest.engine_medians and row.verdict.value == "regressed"


def test_compare_falls_back_to_repeats_when_a_side_ran_one_engine_and_the_report_says_which():
    one = record(tps=500.0)
    one.metrics["output_throughput"] = Metric(value=500.0, unit="tokens/s", samples=[499.0, 500.0, 501.0])
    rows = compare_records([_engines([700.0, 705.0, 698.0])], [one])
    row = next(r for r in rows if r.metric == "output_throughput")
    assert row.test is TimedTest.repeats and "engine medians" not in row.note
    assert "tested on engine medians" not in markdown(rows, "b", "h")
    rows = compare_records([_engines([700.0, 705.0, 698.0])], [_engines([500.0, 505.0, 498.0])])
    assert "Timed metrics tested on engine medians (Welch t" in markdown(rows, "b", "h")


def test_a_metric_with_engine_medians_and_no_samples_counts_as_timed():
    # probe time per batch and engine start time carry engine medians only: compare judges them,
    # so the A/A counts and floors must see them (they were judged at the plain 5%, never counted)
    def probe(medians):
        r = record(tps=600.0)
        r.metrics["probe_time_per_batch"] = Metric(
            value=sorted(medians)[1], unit="s", samples=[], higher_is_better=False, engine_medians=list(medians)
        )
        return r

    rows = compare_records([probe([1.0, 1.01, 0.99])], [probe([1.2, 1.21, 1.19])])
    row = next(r for r in rows if r.metric == "probe_time_per_batch")
    assert row.test is TimedTest.engine_medians and row.timed and row.verdict.value == "regressed"
    assert noise_report(rows).flagged >= 1
    # a count that follows the windows (SGLang's steps) gets a verdict but is no timing
    steps = [record(tps=600.0), record(tps=600.0)]
    for r, meds in zip(steps, ([4621.0, 2245.0, 2377.0], [2300.0, 2250.0, 2390.0])):
        r.metrics["sglang_steps"] = Metric(value=meds[1], unit="steps", engine_medians=meds)
    row = next(r for r in compare_records(steps[:1], steps[1:]) if r.metric == "sglang_steps")
    assert row.test is not None and not row.timed


def test_engine_medians_reach_compare_through_the_store_frame(tmp_path):
    for version, meds in (("0.5.16", [700.0, 705.0, 698.0]), ("0.5.17", [500.0, 505.0, 498.0])):
        r = _engines(meds)
        r.provenance.sglang_version = version
        append_record(results_path(tmp_path, "m", version, r.suite, None, True), r)
    rows = compare_specs("sglang_version=0.5.16", "sglang_version=0.5.17", tmp_path)
    row = next(r for r in rows if r.metric == "output_throughput")
    assert row.test is TimedTest.engine_medians and row.verdict.value == "regressed"


# -- timed windows and the CI target --------------------------------------------------------------


def test_each_repeat_holds_at_least_min_timed_s_of_decode_and_the_oracle_still_checks_every_batch(monkeypatch):
    eng = _timed_engine(monkeypatch, prefill_s=0.02, full_s=0.12)  # 0.10 s of decode per batch
    res = run_case(eng, CASE, repeats=2, warmup=False, plan=RepeatPlan(2, min_timed_s=0.45))
    win = res["details"]["timed_windows"]
    assert win["batches_per_repeat"] == [5, 5] and win["repeats"] == 2 and win["stopped_by"] == "repeats"
    assert len(res["details"]["prompt_starts"]) == 10 and len(res["metrics"]["output_throughput"]["samples"]) == 2
    assert res["checks"] == {"lossless": True, "accept_length_matches_oracle": True}
    tokens = CASE.batch_size * CASE.output_len
    assert res["metrics"]["output_throughput"]["value"] == pytest.approx(5 * tokens / (5 * 0.12))


def test_repeats_stop_once_the_bootstrap_ci_reaches_its_target(monkeypatch):
    eng = _timed_engine(monkeypatch, prefill_s=0.02, full_s=0.12)  # every batch alike: CI 0
    res = run_case(eng, CASE, repeats=3, warmup=False, plan=RepeatPlan(3, ci_half_width=0.01, max_repeats=20))
    win = res["details"]["timed_windows"]
    assert win["repeats"] == 3 and win["stopped_by"] == "ci_target" and win["ci_half_width"] == 0.0


def test_repeats_stop_at_max_repeats_when_the_ci_stays_wide(monkeypatch):
    eng = _timed_engine(monkeypatch, prefill_s=0.02, full_s=0.12)
    walls = iter([0.12, 0.24] * 50)
    real = type(eng).generate

    def noisy(self, input_ids, sampling_params):
        if sampling_params["max_new_tokens"] > 1:
            self.full_s = next(walls)
        return real(self, input_ids, sampling_params)

    monkeypatch.setattr(type(eng), "generate", noisy)
    res = run_case(eng, CASE, repeats=3, warmup=False, plan=RepeatPlan(3, ci_half_width=0.01, max_repeats=7))
    win = res["details"]["timed_windows"]
    assert win["repeats"] == 7 and win["stopped_by"] == "max_repeats" and win["ci_half_width"] > 0.01
    assert len(res["metrics"]["output_throughput"]["samples"]) == 7


def test_the_bootstrap_interval_is_seeded_and_shrinks_with_agreeing_samples():
    wide, narrow = [600.0, 900.0, 650.0, 980.0], [800.0, 801.0, 799.0, 800.5]
    assert median_ci_half_width(wide) == median_ci_half_width(wide) > median_ci_half_width(narrow)
    assert median_ci_half_width([1.0]) is None


def test_the_suite_keys_default_off_and_reach_the_worker_spec(tmp_path):
    plain = worker_timing(_suite(tmp_path).spec.suite)
    assert plain["min_timed_s"] is None and plain["ci_half_width"] is None and plain["max_repeats"] is None
    assert not plain["step_times"] and not plain["pin_cores"]
    on = _suite(
        tmp_path, "min_timed_s = 2\nci_half_width = 0.01\nmax_repeats = 20\nstep_times = true\npin_cores = true"
    )
    spec = worker_timing(on.spec.suite)
    assert spec["min_timed_s"] == 2 and spec["ci_half_width"] == 0.01 and spec["max_repeats"] == 20
    assert spec["step_times"] and spec["pin_cores"]


@pytest.mark.parametrize(
    "header,field",
    [
        ("engine_starts = 0", "suite.engine_starts"),
        ('min_timed_s = "2"', "suite.min_timed_s"),
        ("ci_half_width = 0", "suite.ci_half_width"),
        ("ci_half_width = 0.01\nmax_repeats = 0", "suite.max_repeats"),
        ("repeats = 5\nci_half_width = 0.01\nmax_repeats = 4", "suite"),
        ("pin_cores = 1", "suite.pin_cores"),
    ],
)
def test_bad_timing_keys_are_one_clear_error_naming_the_field(tmp_path, header, field):
    text = _suite(tmp_path).path.read_text().replace("repeats = 1\n", "" if "repeats" in header else "repeats = 1\n")
    (tmp_path / "s.toml").write_text(text.replace("timeout_s = 10\n", f"timeout_s = 10\n{header}\n"))
    with pytest.raises(SpecwatchInputError) as e:
        load_suite(tmp_path / "s.toml")
    assert e.value.field == field


# -- SGLang's own step times ----------------------------------------------------------------------


class SteppingEngine(FakeEngine):
    """Records a decode step time per decode forward, as SGLang with SGLANG_RECORD_STEP_TIME does:
    the first step of each batch also spans the gap before it (``gap_s``)."""

    def __init__(self, case, step_s=0.004, gap_s=0.2, recording=True):
        super().__init__(case)
        self.steps: dict = {}
        self.step_s, self.gap_s, self.recording = step_s, gap_s, recording

    def generate(self, input_ids, sampling_params):
        n = sampling_params["max_new_tokens"]
        if n > 1:
            forwards = -(-(n - 1) // (self.case.num_steps + 1))
            times = [self.gap_s] + [self.step_s * (1 + 0.01 * (i % 3)) for i in range(forwards - 1)]
            self.steps.setdefault(len(input_ids), []).extend(times)
        return super().generate(input_ids, sampling_params)

    def get_server_info(self):
        info = super().get_server_info()
        if self.recording:
            info["internal_states"][0]["step_time_dict"] = {k: list(v) for k, v in self.steps.items()}
        return info


def test_step_times_of_the_timed_window_only_with_each_batchs_gap_dropped():
    eng = SteppingEngine(CASE)
    window = step_times.StepWindow(eng, "0.5.17", step_time_source("0.5.17"))
    res = run_case(eng, CASE, repeats=3, warmup=True, before_timed=window.start)
    metrics, details = window.finish(len(res["details"]["prompt_starts"]))
    forwards = -(-(CASE.output_len - 1) // (CASE.num_steps + 1))
    assert details["entries"] == 3 * forwards and details["dropped"] == 3  # the warm-up's are not in it
    assert metrics["sglang_steps"]["value"] == 3 * (forwards - 1)
    assert 4.0 <= metrics["sglang_step_time"]["value"] <= metrics["sglang_step_time_p90"]["value"] <= 4.08
    assert metrics["sglang_step_time"]["unit"] == "ms" and details["batch_sizes"] == [CASE.batch_size]


def test_the_plain_loop_reads_sglangs_step_clock_over_its_timed_calls_only():
    """The baseline reads the same clock as the probed case (``StepWindow`` around its timed calls):
    the warm-up's steps stay out, each timed call's first step (the gap before it) is dropped."""
    from specwatch.worker.baseline import plain_loop

    eng = SteppingEngine(CASE, gap_s=0.2)
    window = step_times.StepWindow(eng, "0.5.17", step_time_source("0.5.17"))
    out = plain_loop(eng, CASE, repeats=3, window=window)
    got = out["sglang_step_times"]
    assert set(got) == set(step_times.QUANTILES) and 4.0 <= got["sglang_step_time_p10"] <= got["sglang_step_time"]
    assert got["sglang_step_time_p90"] <= 4.08  # no 200 ms gap left in the window
    dist = out["sglang_step_distribution"]
    assert dist["p50"] == pytest.approx(got["sglang_step_time"], abs=1e-3) and dist["max"] <= 4.08
    silent = SteppingEngine(CASE, recording=False)
    out = plain_loop(
        silent, CASE, repeats=2, window=step_times.StepWindow(silent, "0.5.17", step_time_source("0.5.17"))
    )
    assert "sglang_step_times" not in out and "step_time_dict" in out["sglang_step_times_error"]


class _StepDict:
    """An engine whose scheduler recorded ``steps`` (seconds, in order) at batch size 8."""

    def __init__(self, steps):
        self.steps = list(steps)

    def get_server_info(self):
        return {"internal_states": [{"step_time_dict": {"8": list(self.steps)}}], "version": "0.5.17"}


def test_the_fast_state_step_time_holds_where_the_median_follows_the_share_of_slow_steps():
    # a CPU-bound loop on a vCPU that runs at full speed (1 ms a step) or at half (2 ms): two
    # engines with 30% and 60% of their steps slow, and one prefill gap per timed batch
    windows = []
    for slow_share in (0.3, 0.6):
        n_slow = int(1000 * slow_share)
        eng = _StepDict([])
        window = step_times.StepWindow(eng, "0.5.17", step_time_source("0.5.17"))
        window.start()
        eng.steps = [0.050] + [0.002] * n_slow + [0.001] * (1000 - n_slow) + [0.040]
        windows.append(window.finish(timed_batches=2, repeats=4))
    (m30, d30), (m60, d60) = windows
    assert d30["dropped"] == 2 and d30["slices"] == 4 and m30["sglang_steps"]["value"] == 1000
    assert m30["sglang_step_time_p10"]["value"] == m60["sglang_step_time_p10"]["value"] == pytest.approx(1.0)
    assert m30["sglang_step_time"]["value"] == pytest.approx(1.0) and m60["sglang_step_time"]["value"] == pytest.approx(
        2.0
    )
    # one sample per slice, in recorded order: the slow steps came first
    assert m60["sglang_step_time"]["samples"] == pytest.approx([2.0, 2.0, 1.0, 1.0])
    assert all(len(m30[k]["samples"]) == 4 for k in step_times.QUANTILES)
    # the distribution shows the two states: the share of slow steps, the fast and slow ends
    assert d30["distribution_ms"]["slow_share"] == pytest.approx(0.3)
    assert d60["distribution_ms"]["slow_share"] == pytest.approx(0.6)
    assert d60["distribution_ms"]["p10"] == pytest.approx(1.0) and d60["distribution_ms"]["p90"] == pytest.approx(2.0)
    assert d30["distribution_ms"]["max"] == pytest.approx(2.0)  # the gaps are dropped before it


def test_a_window_of_one_repeat_still_gives_two_slices():
    eng = _StepDict([])
    window = step_times.StepWindow(eng, "0.5.17", step_time_source("0.5.17"))
    window.start()
    eng.steps = [0.001, 0.003, 0.001, 0.003, 0.009]
    metrics, details = window.finish(timed_batches=1, repeats=1)
    assert details["slices"] == 2 and len(metrics["sglang_step_time_p10"]["samples"]) == 2
    assert metrics["sglang_step_time_p90"]["value"] < 9.0  # the gap is dropped, wherever it fell


def test_a_release_or_scheduler_without_step_times_records_why():
    eng = SteppingEngine(CASE, recording=False)
    window = step_times.StepWindow(eng, "0.5.17", step_time_source("0.5.17"))
    window.start()
    metrics, details = window.finish(1)
    assert not metrics and "returned no step_time_dict" in details["error"]
    metrics, details = step_times.StepWindow(eng, "0.9.0", step_time_source("0.9.0")).finish(1)
    assert not metrics and "no step-time recording known" in details["error"]


def test_enabling_step_times_sets_sglangs_variable_and_logs_every_decode_step(monkeypatch):
    monkeypatch.delenv("SGLANG_RECORD_STEP_TIME", raising=False)
    kwargs = {}
    assert step_times.enable("0.5.23", kwargs) is not None
    assert os.environ["SGLANG_RECORD_STEP_TIME"] == "1" and kwargs == {"decode_log_interval": 1}
    kwargs = {}
    assert step_times.enable("1.0.0", kwargs) is None and kwargs == {}


@pytest.mark.parametrize("source", STEP_TIME_SOURCES, ids=lambda s: f"{s.first}-{s.last}")
def test_every_release_range_records_and_returns_step_times_where_its_adapter_says(source):
    for version in (source.first, source.last):
        srt = SGLANG_SRC / version / "sglang" / "srt"
        if not srt.exists():
            pytest.skip(f"no SGLang {version} source here")
        assert f"RECORD_STEP_TIME = envs.{source.env}.get()" in (srt / source.recorded_in).read_text()
        assert f'["{source.state_key}"] = ' in (srt / source.returned_by).read_text()
        args = [srt / "server_args.py", *sorted((srt / "arg_groups").rglob("*.py"))]
        assert any(f"{source.interval_arg}: " in f.read_text() for f in args if f.exists())


def test_the_worker_records_step_times_and_pinning_end_to_end(tmp_path, monkeypatch):
    from specwatch.worker import main as worker_main

    monkeypatch.setattr(worker_main, "running_version", lambda: "0.5.17")
    got = {}

    class Engine(SteppingEngine):
        def __init__(self, **kw):
            got.update(kw)
            super().__init__(CASE)

        def shutdown(self):
            pass

    monkeypatch.setitem(sys.modules, "sglang", types.SimpleNamespace(Engine=Engine))
    monkeypatch.setattr(worker_main, "case_models", lambda *a, **k: (tmp_path / "t", tmp_path / "d"))
    monkeypatch.setattr(worker_main, "pin_cores", lambda: {"pinned": False, "reason": "fake host"})
    monkeypatch.delenv("SGLANG_RECORD_STEP_TIME", raising=False)
    out, spec = tmp_path / "out.jsonl", tmp_path / "spec.json"
    spec.write_text(
        json.dumps(
            {
                "cases": [CASE.params()],
                "repeats": 2,
                "warmup": True,
                "models_dir": str(tmp_path),
                "results": str(out),
                "step_times": True,
                "pin_cores": True,
                "min_timed_s": 0.0001,
            }
        )
    )
    assert worker_main.main(str(spec)) == 0
    rec = json.loads(out.read_text().splitlines()[-1])
    assert rec["status"] == "ok", rec.get("log_tail")
    assert got["decode_log_interval"] == 1 and rec["metrics"]["sglang_step_time"]["unit"] == "ms"
    assert rec["details"]["core_pinning"] == {"pinned": False, "reason": "fake host"}
    assert rec["details"]["timed_windows"]["repeats"] == 2


# -- core pinning ---------------------------------------------------------------------------------

TREE = [
    pinning.Proc(101, "sglang::scheduler_TP0"),
    pinning.Proc(102, "sglang::scheduler_TP1"),
    pinning.Proc(103, "sglang::detokenizer"),
    pinning.Proc(104, "python -c from multiprocessing.resource_tracker import main"),
]


def _pin(allowed, siblings=lambda cpu: None, tree=TREE):
    calls = []
    details = pinning.pin_cores(
        procs=tree,
        allowed=set(allowed),
        setaffinity=lambda tid, cpus: calls.append((tid, cpus)),
        tasks=lambda pid: [pid, pid + 1000],
        siblings=siblings,
    )
    return details, calls


def test_sglangs_processes_and_the_worker_get_distinct_cores_every_thread_pinned():
    details, calls = _pin(range(8))
    own = os.getpid()
    assert calls == [
        (101, {1}),
        (1101, {1}),
        (102, {2}),
        (1102, {2}),
        (103, {3}),
        (1103, {3}),
        (own, {4}),
        (own + 1000, {4}),
    ]  # core 0 left to interrupts; the resource tracker left alone; 7 cores for 4: one each
    assert details["pinned"] and [p["role"] for p in details["processes"]] == [
        "scheduler",
        "scheduler",
        "detokenizer",
        "worker",
    ]


def test_with_cores_to_spare_each_process_gets_a_set_its_threads_share():
    details, calls = _pin(range(16))
    own = os.getpid()
    assert calls[0] == (101, {1, 2}) and calls[1] == (1101, {1, 2})  # both threads, one set
    sets = [p["cpus"] for p in details["processes"]]
    assert sets == [[1, 2], [3, 4], [5, 6], [7, 8]] and calls[-1] == (own + 1000, {7, 8})
    assert max(len(c) for c in sets) == pinning.CORES_PER_PROCESS


def test_pinning_takes_one_logical_cpu_per_physical_core():
    details, calls = _pin(range(8), siblings=lambda cpu: f"{cpu % 4},{cpu % 4 + 4}")  # 4 cores, 2 threads
    assert sorted({next(iter(c)) for _, c in calls}) == [0, 1, 2, 3] and details["pinned"]


def test_a_host_with_too_few_cores_records_why_it_did_not_pin():
    details, calls = _pin(range(3))
    assert not calls and not details["pinned"] and "3 usable cores for 4 processes" in details["reason"]
    details, calls = _pin(range(8), tree=TREE[3:])
    assert not calls and "no sglang::scheduler" in details["reason"]


def test_the_merged_record_keeps_each_engines_cpu_readings_windows_and_step_distribution():
    from records import record
    from specwatch.run.engine_starts import merge_records

    recs = [record(tps=t) for t in (100.0, 80.0)]
    for r, span in zip(recs, (2.0, 2.5)):
        r.details["timed_cpu"] = {"scheduler_pid": 1, "scheduler_cpu": 1, "repeats": [{"span_s": span}]}
        r.details["sglang_step_times"] = {"entries": 9, "distribution_ms": {"p10": span, "slow_share": span / 10}}
    recs[0].details["timed_windows"] = {"repeats": 3, "stopped_by": "ci_target"}
    recs[1].details["timed_windows"] = {"repeats": 6, "stopped_by": "max_repeats"}
    merged = merge_records(recs, 2)
    engines = merged.details["engine_starts"]["engines"]
    assert [e["timed_windows"]["repeats"] for e in engines] == [3, 6]  # each engine's own windows
    assert merged.details["timed_windows"]["repeats"] == 3  # the record's: the first engine's
    assert [e["timed_cpu"]["repeats"][0]["span_s"] for e in engines] == [2.0, 2.5]
    assert [e["sglang_step_distribution"]["slow_share"] for e in engines] == [0.2, 0.25]


def _merged_with_counts(windowed: bool, accept: tuple = (4.0, 4.0)):
    from records import record
    from specwatch.run.engine_starts import merge_records

    recs = []
    for unaligned, acc in zip((15748.0, 13970.0), accept):
        r = record(tps=100.0)
        r.metrics["decode_unaligned_batches"] = Metric(value=unaligned, unit="batches", exact=True)
        r.metrics["accept_length"] = Metric(value=acc, unit="tokens/verify", exact=True, higher_is_better=True)
        if windowed:
            r.details["timed_windows"] = {"repeats": 12}
        recs.append(r)
    return merge_records(recs, 2)


def test_engine_agreement_is_judged_again_without_counts_over_every_batch_where_windows_ran():
    from specwatch.analysis.health import failed_checks
    from specwatch.store.frame import records_frame

    windowed, fixed, broken = (
        _merged_with_counts(True),
        _merged_with_counts(False),
        _merged_with_counts(True, (4.0, 3.0)),
    )
    assert not windowed.checks[AGREE_CHECK] and not fixed.checks[AGREE_CHECK]  # the recorded verdicts stay
    df = records_frame([windowed, fixed, broken])
    assert df["engines_agree_now"].tolist() == [True, None, False]
    notes = failed_checks(df).note.tolist()
    assert "timed windows vary" in notes[0] and "timed windows vary" not in notes[1] + notes[2]
