"""``specwatch plan --hosts N --gpus-per-host G``: recorded engine starts and case times,
list-scheduled over N hosts of G GPUs (``run.estimate``)."""

import subprocess
import sys
from datetime import timedelta

import pytest
from typer.testing import CliRunner

from conftest import harness_suite
from records import T0, case, record
from specwatch.cli import app
from specwatch.core.placement import TimingScope
from specwatch.core.record import Metric, Status
from specwatch.run.estimate import GroupTime, host_wall, list_schedule, makespan, wall_estimate
from specwatch.store.jsonl import append_record

runner = CliRunner()


def g(tp=1, start=10.0, cases=5.0):
    return GroupTime(tp, start, cases)


def test_groups_on_gpus_of_their_own_run_wholly_at_once_under_gpu_scope():
    four = [g(), g(), g(), g()]  # 15 s each, two GPUs: two rounds
    assert makespan(four, gpus=2) == 30.0
    assert host_wall(four, 2, 1, TimingScope.gpu) == 30.0
    assert makespan(four, gpus=4) == 15.0


def test_host_scope_overlaps_only_the_engine_starts_and_spends_every_case_in_turn():
    four = [g(), g(), g(), g()]  # starts: 2 rounds of 10 s on 2 GPUs; cases: 4 x 5 s one at a time
    assert host_wall(four, 2, 1, TimingScope.host) == 20.0 + 20.0
    assert host_wall(four, 1, 4, TimingScope.host) == 10.0 + 20.0  # 4 parallel starts on one GPU


def test_a_tp_group_takes_tp_gpus_of_one_host_widest_first():
    groups = [g(tp=1, start=5, cases=0), g(tp=2, start=10, cases=0), g(tp=2, start=10, cases=0)]
    assert list_schedule(groups, hosts=2, gpus_per_host=2) == [0, 0, 1]  # the tp-2s fill a host each first
    assert makespan(groups, gpus=2) == 25.0  # one host: tp-2, tp-2, then the tp-1, in turn
    assert makespan(groups, gpus=4) == 15.0  # both tp-2s at once, the tp-1 once GPUs free up


def _store(tmp_path, suite, start_s: float, case_s: float):
    """An ok record of every planned case: ``start_s`` engine start, ``case_s`` from start to finish."""
    path = tmp_path / "m" / "sglang-0.5.17" / f"{suite.name}.jsonl"
    for p in suite.plan():
        r = record(p.case, machine="m", finished_at=T0 + timedelta(seconds=case_s))
        r.suite = suite.name
        r.metrics["engine_start_time"] = Metric(value=start_s, unit="s")
        append_record(path, r)
    return path


def test_wall_estimate_prices_each_group_from_its_records(tmp_path):
    suite = harness_suite(tmp_path, topks="[1, 2]")  # 4 groups of 2 cases
    _store(tmp_path, suite, start_s=40.0, case_s=3.0)
    one = wall_estimate(suite.name, suite.plan(), tmp_path, "m", "0.5.17", hosts=1, gpus_per_host=1)
    assert one.groups == 4 and one.serial_s == 4 * (40 + 6) == one.wall_s
    assert one.priced == {"start own": 4, "case own": 8}
    two = wall_estimate(suite.name, suite.plan(), tmp_path, "m", "0.5.17", hosts=2, gpus_per_host=2)
    assert two.wall_s == 40 + 2 * 6  # one group per GPU; each host times its two groups' cases in turn
    gpu = wall_estimate(suite.name, suite.plan(), tmp_path, "m", "0.5.17", 2, 2, scope=TimingScope.gpu)
    assert gpu.wall_s == 46.0


def test_an_unrecorded_case_is_priced_at_its_models_median(tmp_path):
    suite = harness_suite(tmp_path, topks="[1, 2]")
    path = tmp_path / "m" / "sglang-0.5.17" / f"{suite.name}.jsonl"
    for i, p in enumerate(suite.plan()[:2]):
        r = record(p.case, machine="m", finished_at=T0 + timedelta(seconds=2.0 + 2 * i))
        r.suite = suite.name
        r.metrics["engine_start_time"] = Metric(value=30.0, unit="s")
        append_record(path, r)
    failed = record(
        case(page_size=256), status=Status.crashed, reason="died", machine="m", finished_at=T0 + timedelta(seconds=999)
    )
    failed.suite = suite.name
    append_record(path, failed)  # a crashed record prices nothing
    est = wall_estimate(suite.name, suite.plan(), tmp_path, "m", "0.5.17", hosts=1, gpus_per_host=1)
    assert est.priced == {"start own": 1, "start like": 3, "case own": 2, "case like": 6}
    assert est.serial_s == 4 * 30 + 2 + 4 + 6 * 3.0


def test_plan_hosts_prints_the_wall_time(tmp_path):
    suite = harness_suite(tmp_path, topks="[1, 2]")
    _store(tmp_path, suite, start_s=40.0, case_s=3.0)
    args = ["plan", str(tmp_path / "s.toml"), "--pace", str(tmp_path), "--machine", "m", "--sglang-version", "0.5.17"]
    res = runner.invoke(app, [*args, "--hosts", "2", "--gpus-per-host", "2"], terminal_width=300)
    assert res.exit_code == 0, res.output
    said = " ".join(res.output.split())  # the line as read, however the terminal wraps it
    assert "4 engine group(s) on 2 host(s) x 2 GPU(s), timing scope host: ≈ 52 s of wall time (184 s" in said


@pytest.mark.parametrize(
    "extra, says",
    [
        (["--hosts", "2"], "--hosts needs --pace"),
        (["--hosts", "2", "--pace", "{root}", "--machine", "nope", "--sglang-version", "0.5.17"], "no records"),
    ],
)
def test_plan_hosts_without_times_is_one_line_and_exit_2(tmp_path, extra, says):
    harness_suite(tmp_path)
    extra = [x.replace("{root}", str(tmp_path)) for x in extra]
    res = subprocess.run(
        [sys.executable, "-m", "specwatch.cli", "plan", str(tmp_path / "s.toml"), *extra],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 2 and says in res.stderr and "Traceback" not in res.stderr, res.stderr


def test_a_suite_of_several_engine_starts_costs_that_many_times_the_device_time():
    from specwatch.run.estimate import DeviceEstimate

    once = DeviceEstimate("s", "m", "0.5.23", 0, [], groups=4, per_group_s=30.0, runs=2)
    thrice = DeviceEstimate("s", "m", "0.5.23", 0, [], groups=4, per_group_s=30.0, runs=2, engine_starts=3)
    assert once.device_minutes == 2.0 and thrice.device_minutes == 6.0
