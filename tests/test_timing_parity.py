"""What a timed batch runs after (the worker's repeat against a plain loop's), the garbage-collector
pauses recorded beside it, and ``scripts/timing_parity.py``'s options and report, on fake engines."""

import gc
import importlib.util
import json
import types
from pathlib import Path

import pytest

from specwatch.core.case import Algorithm, Case, ModelSize, Workload
from specwatch.worker import measure
from specwatch.worker.measure import run_case
from test_engine_worker import CASE, FakeEngine

ROOT = Path(__file__).resolve().parents[1]
PAGE1 = CASE.model_copy(update={"page_size": 1, "batch_size": 8, "input_len": 48})


class Logged(FakeEngine):
    """The fake engine with a radix cache the flush empties, logging every call in order."""

    def __init__(self, case, log):
        super().__init__(case)
        self.log = log

    def flush_cache(self):
        self.cache.clear()
        self.log.append(("flush",))
        return True

    def generate(self, input_ids, sampling_params):
        outs = super().generate(input_ids, sampling_params)
        self.log.append(
            ("generate", sampling_params["max_new_tokens"], [o["meta_info"]["cached_tokens"] for o in outs])
        )
        return outs


def _exact(res):
    return {k: v for k, v in res["metrics"].items() if v["exact"]}, {
        k: res["details"][k] for k in ("output_digest", "prompt_starts")
    }


def test_a_timed_batch_follows_an_untimed_batch_not_a_flush_and_no_prompt_is_served_from_cache(monkeypatch):
    log = []
    warm = run_case(Logged(PAGE1, log), PAGE1, repeats=3, warmup=True)
    calls = [c[:2] for c in log]
    per_repeat = [("flush",), ("generate", 1), ("generate", 1), ("generate", PAGE1.output_len)]
    assert calls == [("generate", PAGE1.output_len)] + per_repeat * 3
    assert all(not any(c[2]) for c in log[1:] if c[0] == "generate")  # prefill-only and timed: full prefill
    # the same exact metrics, outputs and timed prompts as with a flush before each timed batch
    monkeypatch.setattr(measure, "warm_after_flush", lambda case: False)
    log.clear()
    flushed = run_case(Logged(PAGE1, log), PAGE1, repeats=3, warmup=True)
    assert [c[:2] for c in log][1:5] == [("flush",), ("generate", 1), ("flush",), ("generate", PAGE1.output_len)]
    assert _exact(warm) == _exact(flushed)
    assert warm["details"]["warm_after_flush"] is True


@pytest.mark.parametrize(
    "update",
    [
        {"algorithm": Algorithm.NGRAM},  # its corpus must be empty at the timed batch
        {"workload": Workload.near_full},  # its pool is sized to the timed batch
        {"batch_size": 400},  # three disjoint batches need 1200 starts: the tiny oracle has 1024
        {"model": ModelSize.llama_8b, "batch_size": 8, "input_len": 4096},  # the pool cannot hold three batches
    ],
)
def test_the_flush_stays_right_before_the_timed_batch_where_the_cache_could_touch_it(update):
    case = CASE.model_copy(update=update)
    assert measure.warm_after_flush(CASE) and not measure.warm_after_flush(case)


def test_garbage_collections_inside_each_timed_batch_are_recorded_per_repeat():
    class Collecting(FakeEngine):
        def generate(self, input_ids, sampling_params):
            if sampling_params["max_new_tokens"] > 1:
                gc.collect()
            return super().generate(input_ids, sampling_params)

    pauses = run_case(Collecting(CASE), CASE, repeats=2, warmup=True)["details"]["timed_gc_pauses"]
    assert len(pauses) == 2 and all(p["collections"] >= 1 and p["pause_s"] > 0 for p in pauses)


def test_the_probe_reports_the_schedulers_gc_pauses_since_the_last_read():
    pytest.importorskip("torch")
    from specwatch.cpu.probe_cost import load_probe
    from test_probe import Scheduler

    class Own(Scheduler):  # patched on its own, not test_probe's class
        pass

    probe = load_probe()
    probe._patch_scheduler(types.SimpleNamespace(Scheduler=Own))
    s = Own()
    s.get_internal_state(None)  # reset
    gc.collect()
    facts = s.get_internal_state(None)["specwatch"]["gc"]
    assert facts["collections"][2] >= 1 and facts["pause_s"] >= facts["max_pause_s"] > 0
    assert s.get_internal_state(None)["specwatch"]["gc"]["collections"][2] == 0  # reset by the read
    gc.callbacks.remove(probe._gc_pause)


def _script():
    spec = importlib.util.spec_from_file_location("timing_parity", ROOT / "scripts" / "timing_parity.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize(
    "argv,option",
    [
        (["--order", "plain,fast"], "--order"),
        (["--repeats", "0"], "--repeats"),
        (["--topk", "0"], "--topk"),
        (["--backend", "cuda-magic"], "--backend"),
    ],
)
def test_a_bad_option_is_one_line_naming_it_and_exit_2(argv, option, capsys):
    assert _script().main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"timing_parity: {option}") and "\n" not in err


def test_kinds_run_interleaved_by_round_and_the_report_gives_medians_spreads_and_ratios():
    tp = _script()
    args = tp.parse_args(["--rounds", "2", "--repeats", "3"])
    case = tp.case_from_args(args)
    assert case.topk == 4 and case.batch_size == 16 and case.input_len == 1000 and case.output_len == 300
    seen = []
    tps = {"plain": [100.0, 102.0, 98.0], "probed": [95.0, 90.0, 85.0], "bare": [50.0, 55.0, 60.0]}

    def runner(kind):
        def run(left):
            seen.append(kind)
            if kind == "plain":
                return {
                    "plain": {"tps": tps["plain"], "cached_tokens": [0, 0, 0]},
                    "plain_flushed": {"tps": [90.0] * 3},
                }
            return {kind: {"tps": tps[kind], "timed_gc_pauses": [{"collections": 0, "pause_s": 0.0}] * 3}}

        return run

    report = tp.experiment(case, args, {k: runner(k) for k in tp.KINDS})
    assert seen == ["plain", "probed", "bare"] * 2 and report["sequence"] == ["plain0", "probed0", "bare0"] * 1 + [
        "plain1",
        "probed1",
        "bare1",
    ]
    k = report["kinds"]
    assert k["plain"]["median"] == 100.0 and k["plain"]["per_repeat"] == [tps["plain"]] * 2
    assert k["probed"]["spread"] == round(10 / 90, 4) and k["probed"]["run_medians"] == [90.0, 90.0]
    assert report["ratios"] == {"probed/plain": 0.9, "bare/plain": 0.55, "plain_flushed/plain": 0.9}
    json.dumps(report)  # printable as JSON


def test_runs_past_the_budget_are_named_not_started_and_a_failed_run_is_reported():
    tp = _script()
    args = tp.parse_args(["--rounds", "2", "--budget-s", "10"])
    now = iter([0.0, 0.0, 5.0, 11.0, 11.0, 11.0, 11.0, 11.0])
    runners = {
        "plain": lambda left: {"error": "exit code 1"},
        "probed": lambda left: {"probed": {"tps": [1.0, 2.0, 3.0]}},
        "bare": lambda left: {"bare": {"tps": [1.0]}},
    }
    report = tp.experiment(tp.case_from_args(args), args, runners, clock=lambda: next(now))
    assert report["sequence"] == ["plain0", "probed0"]
    assert report["not_run"] == ["round 0 bare", "round 1 plain", "round 1 probed", "round 1 bare"]
    assert report["kinds"]["plain"]["errors"] == ["exit code 1"] and report["ratios"] == {}
    assert Case(**report["case_params"]).case_id == report["case"]


def test_the_plain_loop_readies_each_timed_batch_then_times_the_flushed_pattern_on_one_engine():
    from specwatch.worker.baseline import plain_loop

    tp = _script()
    case = tp.case_from_args(tp.parse_args(["--batch", "4", "--input-len", "40", "--output-len", "16"]))
    log = []
    out = plain_loop(Logged(case, log), case, repeats=2, flushed=True)
    calls = [c[:2] for c in log]
    full = ("generate", case.output_len)
    readied = [("flush",), ("generate", 1), full]  # worker.baseline.fresh_batch, then the timed call
    assert calls == [("flush",), full] + readied * 2 + [("flush",), ("generate", 1), ("flush",), full] * 2
    assert len(out["output_throughput"]) == len(out["flushed_output_throughput"]) == 2
    assert all(v > 0 for v in out["output_throughput"]) and out["flushed_cached_tokens"] == [0, 0]
    log.clear()
    assert set(plain_loop(Logged(case, log), case, repeats=2)) == {"output_throughput", "cached_tokens"}
    assert [c[:2] for c in log] == [("flush",), full] + readied * 2  # --baseline: the loop alone


def test_the_plain_run_is_the_baseline_worker_with_the_flushed_pattern(tmp_path, monkeypatch):
    import specwatch.run.baseline as rb
    from specwatch.core.protocol import BaselineLine

    tp = _script()
    args = tp.parse_args(["--repeats", "2"])
    case = tp.case_from_args(args)
    seen = {}

    def fake(spec, module, env, timeout_s, log):
        seen.update(spec=spec, module=module, env=env)
        line = BaselineLine(
            case_id=case.case_id,
            output_throughput=[10.0, 11.0],
            cached_tokens=[0, 0],
            flushed_output_throughput=[9.0, 9.5],
            flushed_cached_tokens=[0, 0],
        )
        return rb.BaselineRun(lines={case.case_id: line})

    monkeypatch.setattr(rb, "run_baseline", fake)
    got = tp.run_plain(case, args, tmp_path, 60)
    assert got["plain"]["tps"] == [10.0, 11.0] and got["plain_flushed"]["tps"] == [9.0, 9.5]
    assert seen["module"] == "specwatch.worker.baseline" and seen["spec"].flushed and seen["spec"].repeats == 2
    assert not [k for k in seen["env"] if k.startswith("SPECWATCH_")]
    monkeypatch.setattr(rb, "run_baseline", lambda *a: rb.BaselineRun(error="baseline process ran past 60 s"))
    assert tp.run_plain(case, args, tmp_path, 60) == {"error": "baseline process ran past 60 s"}


def test_the_report_carries_the_hosts_provenance(tmp_path, monkeypatch):
    tp = _script()
    monkeypatch.setattr(tp, "run_plain", lambda case, args, tmp, left: {"plain": {"tps": [100.0, 101.0]}})
    monkeypatch.setattr(tp, "run_worker", lambda case, args, tmp, left, probe: {"x": {"tps": [99.0, 98.0]}})
    out = tmp_path / "parity.json"
    assert tp.main(["--rounds", "1", "--order", "plain,probed", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["kinds"]["plain"]["median"] == 100.5
    prov = report["provenance"]
    assert prov["specwatch_version"] and prov["python_version"] and prov["started_at"] <= prov["finished_at"]
