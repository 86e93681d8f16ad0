"""The runner<->worker wire: typed lines, one bad line costs one case, and workers never outlive their runner."""

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import harness_suite, own_tmpdir_env
from records import case
from specwatch.core import lifeline
from specwatch.core.protocol import (
    CaseLine,
    EngineFacts,
    EngineStarted,
    Event,
    MalformedLine,
    NonFiniteMetric,
    WorkerSpec,
    metric,
    parse_line,
)
from specwatch.core.record import Status
from specwatch.run.case_records import MALFORMED
from specwatch.run.runner import RunOptions, run_suite
from specwatch.store.jsonl import read_records

HERE = os.path.dirname(__file__)
FAKE_ENV = {"PYTHONPATH": HERE + os.pathsep + os.environ.get("PYTHONPATH", "")}


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie waiting for its reaper."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def _gone_within(pids, seconds: float) -> list[int]:
    """The pids still alive after ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if _alive(p)]


def _suite(tmp_path, topks="[1]", timeout_s=30):
    return harness_suite(tmp_path, name="wire", topks=topks, draft=9, timeout_s=timeout_s)


def test_every_wire_line_parses_to_its_type_and_a_bad_one_to_malformed_without_raising():
    assert isinstance(parse_line('{"event": "engine_started", "engine_start_s": 1.5}'), EngineStarted)
    assert isinstance(parse_line('{"event": "engine_facts", "checks": {"x": true}}'), EngineFacts)
    ok = parse_line('{"case_id": "c", "status": "ok", "metrics": {"t": {"value": 1, "unit": "s"}}}')
    assert isinstance(ok, CaseLine) and ok.status is Status.ok and ok.metrics["t"].value == 1.0
    bad = {
        "not json": "{",
        "a list": "[1]",
        "bad status": '{"case_id": "c", "status": "great"}',
        "no unit": '{"case_id": "c", "status": "ok", "metrics": {"t": {"value": 1}}}',
        "not a number": '{"case_id": "c", "status": "ok", "metrics": {"t": {"value": "fast", "unit": "s"}}}',
        "nan": '{"case_id": "c", "status": "ok", "metrics": {"t": {"value": NaN, "unit": "s"}}}',
        "failed without reason": '{"case_id": "c", "status": "failed"}',
        "unknown event": '{"event": "lunch"}',
        "unknown field": '{"case_id": "c", "status": "ok", "speed": 3}',
    }
    for what, raw in bad.items():
        line = parse_line(raw)
        assert isinstance(line, MalformedLine) and line.raw == raw and line.error, what
    assert parse_line(bad["bad status"]).case_id == "c" and "status" in parse_line(bad["bad status"]).error
    assert "unit" in parse_line(bad["no unit"]).error


def test_event_names_are_one_enum_shared_by_the_timing_lock_and_the_runner():
    from specwatch.core import timing_lock
    from specwatch.run import group

    assert timing_lock.HELD_EVENT is Event.start_lock_held and timing_lock.TIMING_EVENT is Event.timing_lock_held
    assert (
        group.STARTED_EVENT is Event.worker_started and json.dumps({"e": Event.engine_facts}) == '{"e": "engine_facts"}'
    )


def test_a_metric_refuses_nan_and_infinity():
    assert metric(2, "s", [1, 3], expected=2)["samples"] == [1.0, 3.0]
    for kw in ({"value": math.nan}, {"value": 1, "samples": [1, math.inf]}, {"value": 1, "expected": -math.inf}):
        with pytest.raises(NonFiniteMetric):
            metric(unit="s", **kw)


def test_the_spec_is_a_typed_model_the_runner_writes_and_the_worker_reads(tmp_path):
    spec = WorkerSpec(cases=[case()], repeats=2, warmup=True, models_dir="/m", results="/r", timeout_s=40)
    again = WorkerSpec.model_validate_json(spec.model_dump_json())
    assert again == spec and again.cases[0].case_id == case().case_id
    with pytest.raises(ValueError, match="repeat"):
        WorkerSpec.model_validate({**json.loads(spec.model_dump_json()), "repeat": 3})


@pytest.mark.parametrize(
    "bad",
    [
        '{"case_id": "CASE_ID", "status": "splendid"}',
        '{"case_id": "CASE_ID", "status": "ok", "metrics": {"output_throughput": {"value": 1.0}}}',
        '{"case_id": "CASE_ID", "status": "ok", "metrics": {"output_throughput": {"value": "fast", "unit": "tokens/s"}}}',
        '{"case_id": "CASE_ID", "status": "ok", "metrics": {"output_throughput": {"value": NaN, "unit": "tokens/s"}}}',
        '{"case_id": "CASE_ID", "status": "ok", "speed": 3}',
        "Traceback (most recent call last):",
    ],
)
def test_a_malformed_worker_line_fails_its_case_only_and_the_sweep_goes_on(tmp_path, bad):
    pids = tmp_path / "pids"
    env = dict(FAKE_ENV, FAKE_BAD_LINE=bad, FAKE_WORKER_PIDS=str(pids))
    out = run_suite(
        _suite(tmp_path), tmp_path / "results", RunOptions(gpus=1, worker_module="fake_worker", extra_env=env)
    )
    recs = list(read_records(out))  # every record readable
    assert len(recs) == 4
    failed = [r for r in recs if r.status is Status.failed]
    assert [r.case.batch_size for r in failed] == [1, 1]  # each group's first case, nothing else
    assert all(r.reason.startswith(MALFORMED) for r in failed)
    assert all(bad.replace("CASE_ID", r.case_id) in r.log_tail for r in failed)
    assert {r.status for r in recs if r.case.batch_size == 8} == {Status.ok}
    assert not _gone_within([int(p) for p in pids.read_text().split()], 3)


def test_a_nan_metric_becomes_a_failed_finite_metrics_check_and_the_record_reads_back(tmp_path, monkeypatch):
    import types

    from specwatch.run.case_records import record_from_worker
    from specwatch.store.jsonl import append_record
    from specwatch.worker import main as worker_main
    from test_engine_worker import CASE, FakeEngine

    class Engine(FakeEngine):
        def __init__(self, **kw):
            super().__init__(CASE)

        def generate(self, input_ids, sampling_params):
            outs = super().generate(input_ids, sampling_params)
            for o in outs:
                o["meta_info"]["spec_accept_length"] = math.nan
            return outs

        def shutdown(self):
            pass

    monkeypatch.setitem(sys.modules, "sglang", types.SimpleNamespace(Engine=Engine))
    monkeypatch.setattr(worker_main, "case_models", lambda *a, **k: (tmp_path / "t", tmp_path / "d"))
    results = tmp_path / "out.jsonl"
    spec = tmp_path / "spec.json"
    spec.write_text(
        WorkerSpec(
            cases=[CASE], repeats=2, warmup=False, models_dir=str(tmp_path), results=str(results)
        ).model_dump_json()
    )
    assert worker_main.main(str(spec)) == 0
    line = parse_line(results.read_text().splitlines()[-1])
    assert isinstance(line, CaseLine) and line.status is Status.ok
    assert line.checks["finite_metrics"] is False and "accept_length" not in line.metrics
    assert "accept_length" in line.details["non_finite_metrics"]
    store = tmp_path / "store.jsonl"
    append_record(store, record_from_worker(_suite(tmp_path), CASE, line, None))
    (rec,) = read_records(store)
    assert rec.checks["finite_metrics"] is False and rec.metrics["output_throughput"].value > 0


def _hanging_spec(tmp_path, timeout_s=None) -> Path:
    spec = tmp_path / "spec.json"
    spec.write_text(
        WorkerSpec(
            cases=[case(topk=8, batch_size=8, num_draft_tokens=16)],
            repeats=1,
            warmup=False,
            models_dir=str(tmp_path),
            results=str(tmp_path / "out.jsonl"),
            timeout_s=timeout_s,
        ).model_dump_json()
    )
    return spec


def _wait_for_line(path: Path, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not (path.exists() and "engine_started" in path.read_text()):
        time.sleep(0.1)
    assert path.exists(), "the fake worker never wrote its first line"


def test_a_worker_whose_runner_is_sigkilled_mid_sweep_is_gone_within_seconds(tmp_path):
    _suite(tmp_path, topks="[8]", timeout_s=900)  # batch 1 finishes, batch 8 hangs
    pids = tmp_path / "pids"
    script = f"""
import os, sys
sys.path.insert(0, {HERE!r})
from specwatch.run.runner import RunOptions, run_suite
from specwatch.suite import load_suite
run_suite(load_suite({str(tmp_path / "s.toml")!r}), {str(tmp_path / "results")!r}, RunOptions(gpus=1,
          worker_module="fake_worker", max_groups=1,
          extra_env={{"PYTHONPATH": {HERE!r} + os.pathsep + os.environ.get("PYTHONPATH", ""),
                      "FAKE_WORKER_PIDS": {str(pids)!r}}}))
"""
    # a SIGKILLed runner leaves its worker's folder: keep it under tmp_path
    runner = subprocess.Popen([sys.executable, "-c", script], env=own_tmpdir_env(tmp_path))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not list((tmp_path / "results").rglob("wire.jsonl")):
        time.sleep(0.1)  # the first case is recorded: batch 8 hangs now
    worker = [int(p) for p in pids.read_text().split()]
    assert worker and all(_alive(p) for p in worker)
    runner.send_signal(signal.SIGKILL)
    runner.wait()
    assert not _gone_within(worker, 3), "a worker outlived its SIGKILLed runner"


def test_a_worker_dies_when_its_runners_lifeline_pipe_closes(tmp_path):
    pipe = lifeline.Pipe()
    spec = _hanging_spec(tmp_path)
    proc = subprocess.Popen(
        [sys.executable, os.path.join(HERE, "fake_worker.py"), str(spec)],
        env=dict(os.environ, **FAKE_ENV, **pipe.env()),
        pass_fds=(pipe.read_fd,),
        start_new_session=True,
        stderr=subprocess.PIPE,
    )
    pipe.started()
    _wait_for_line(tmp_path / "out.jsonl")
    assert proc.poll() is None  # hanging in its case while the pipe is open
    pipe.close()
    assert proc.wait(timeout=5) == -signal.SIGKILL
    assert b"its runner is gone" in proc.stderr.read()


def test_a_worker_kills_itself_past_its_own_timeout(tmp_path):
    spec = _hanging_spec(tmp_path, timeout_s=2)
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, os.path.join(HERE, "fake_worker.py"), str(spec)],
        env=dict(os.environ, **FAKE_ENV),
        start_new_session=True,
        stderr=subprocess.PIPE,
    )
    assert proc.wait(timeout=20) == -signal.SIGKILL and time.monotonic() - t0 < 10  # the case sleeps 60 s
    assert b"past its own timeout of 2 s" in proc.stderr.read()


def test_a_worker_dies_with_its_parent_without_any_pipe(tmp_path):
    """The parent-death signal alone: a parent that starts the worker with no lifeline pipe, then is killed."""
    spec = _hanging_spec(tmp_path)
    pid_file = tmp_path / "pid"
    parent = f"""
import subprocess, sys, time
p = subprocess.Popen([sys.executable, {os.path.join(HERE, "fake_worker.py")!r}, {str(spec)!r}], start_new_session=True)
open({str(pid_file)!r}, "w").write(str(p.pid))
time.sleep(120)
"""
    proc = subprocess.Popen([sys.executable, "-c", parent], env=dict(os.environ, **FAKE_ENV))
    _wait_for_line(tmp_path / "out.jsonl")
    worker = int(pid_file.read_text())
    assert _alive(worker)
    proc.kill()
    proc.wait()
    assert not _gone_within([worker], 3)


def test_the_lifeline_deadline_does_not_run_while_paused():
    now = [0.0]
    fired = []
    line = lifeline.Lifeline(None, 20, on_expiry=fired.append, now=lambda: now[0])
    now[0] = 4
    with line.paused():
        now[0] = 100  # 96 s queued for the timing lock
    now[0] = 109
    assert line.check() is None and line.elapsed() == 13
    now[0] = 117
    assert "past its own timeout of 20 s" in line.check()
