"""The executor seam: the local executor as before, the ``gpus`` executor (GPU sets per group,
NVLink islands, the timing scope), placement in provenance and the run summary, and bad options."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import FIXTURES, harness_suite
from specwatch.core.errors import SpecwatchInputError
from specwatch.core.placement import ExecutorKind, TimingScope
from specwatch.core.record import Status
from specwatch.run.executors.topology import discover, islands, parse_gpu_list, parse_topology
from specwatch.run.runner import RunOptions, check_executor, run_suite
from specwatch.store.jsonl import RUNS_FILE, read_records, read_runs

HERE = os.path.dirname(__file__)
SMI = FIXTURES / "nvidia-smi"


def smi_output(listing: str, topo: str):
    """A stand-in for ``nvidia-smi`` that prints the fixtures ``listing`` (-L) and ``topo`` (topo -m)."""
    texts = {("-L",): (SMI / listing).read_text(), ("topo", "-m"): (SMI / topo).read_text()}
    return lambda args: texts.get(tuple(args))


def fake_smi_on_path(tmp_path, monkeypatch, listing="list-x4.txt", topo="topo-pairs-x4.txt"):
    """An ``nvidia-smi`` script first on PATH that prints the fixtures, as the real one prints them."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = "-L" ]; then cat {SMI / listing}; '
        f'elif [ "$1" = "topo" ]; then cat {SMI / topo}; else exit 9; fi\n'
    )
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def gpu_logging_worker(tmp_path):
    """A worker module that logs its pid, ``CUDA_VISIBLE_DEVICES`` and lifetime, then is the fake worker."""
    (tmp_path / "gpu_worker.py").write_text(
        textwrap.dedent(
            """
            import json, os, runpy, time
            t0 = time.time()
            try:
                runpy.run_module("fake_worker", run_name="__main__")
            finally:
                with open(os.environ["GPU_LOG"], "a") as f:
                    f.write(json.dumps({"pid": os.getpid(), "gpus": os.environ.get("CUDA_VISIBLE_DEVICES"),
                                        "order": os.environ.get("CUDA_DEVICE_ORDER"), "t0": t0, "t1": time.time()}) + "\\n")
            """
        )
    )
    return tmp_path / "gpu.log"


def run_fake(tmp_path, suite, root="results", **kw):
    """``run_suite`` with the GPU-logging fake worker; returns the results file and the worker log."""
    log = gpu_logging_worker(tmp_path)
    path = os.pathsep.join([str(tmp_path), HERE, os.environ.get("PYTHONPATH", "")])
    env = {"PYTHONPATH": path, "GPU_LOG": str(log), "FAKE_WORKER_STARTS": str(tmp_path / "starts")}
    out = run_suite(suite, tmp_path / root, RunOptions(worker_module="gpu_worker", extra_env=env, **kw))
    spans = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
    return out, spans


def test_nvlink_islands_are_read_from_the_topology_matrix():
    h200 = parse_topology((SMI / "topo-h200x8.txt").read_text())
    assert h200[("0", "7")] == "NV18" and h200[("3", "3")] == "X" and ("0", "NIC0") not in h200
    assert islands([str(i) for i in range(8)], h200) == [[str(i) for i in range(8)]]
    pairs = parse_topology((SMI / "topo-pairs-x4.txt").read_text())
    assert islands(["0", "1", "2", "3"], pairs) == [["0", "1"], ["2", "3"]]
    assert islands(["0", "2"], pairs) == [["0"], ["2"]]  # NVLink on the host, none between these two
    pcie = parse_topology((SMI / "topo-pcie-x2.txt").read_text())
    assert islands(["0", "1"], pcie) == [["0", "1"]]  # no NVLink at all: PCIe joins them all
    assert parse_gpu_list((SMI / "list-h200x8.txt").read_text()) == [str(i) for i in range(8)]


def test_gpu_discovery_honours_cuda_visible_devices_and_refuses_a_gpu_not_there(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,2,3")
    topo = discover(None, smi_output("list-x4.txt", "topo-pairs-x4.txt"))
    assert topo.gpus == ["1", "2", "3"] and topo.islands == [["1"], ["2", "3"]] and topo.widest == 2
    with pytest.raises(SpecwatchInputError, match=r"--gpus: GPU 0 is not on this host \(it has 1,2,3"):
        discover(("0", "2"), smi_output("list-x4.txt", "topo-pairs-x4.txt"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert discover(("2", "3"), smi_output("list-x4.txt", "topo-pairs-x4.txt")).islands == [["2", "3"]]
    with pytest.raises(SpecwatchInputError, match="no GPU found"):
        discover(None, lambda args: None)


def test_gpus_executor_gives_each_group_its_own_gpu_set_inside_one_island(tmp_path, monkeypatch):
    """4 GPUs in two NVLink pairs; 2 tp-2 and 2 tp-1 groups: a tp-2 group gets a pair, a GPU is
    never two groups' at once (so no rank of a tp engine shares its GPU with another engine, the
    cause of SGLang's 'memory capacity is unbalanced'), and records and summary say where."""
    fake_smi_on_path(tmp_path, monkeypatch)
    os.environ.update(FAKE_START_S="0.3", FAKE_TIME_S="0.1")
    try:
        suite = harness_suite(tmp_path, topks="[1]", extra="tp = [1, 2]")
        out, spans = run_fake(tmp_path, suite, executor=ExecutorKind.gpus)
    finally:
        for k in ("FAKE_START_S", "FAKE_TIME_S"):
            os.environ.pop(k)
    recs = list(read_records(out))
    assert len(recs) == 8 and all(r.status is Status.ok for r in recs), [(r.status, r.reason) for r in recs]
    assert len(spans) == 4 and all(s["order"] == "PCI_BUS_ID" for s in spans)
    for a in spans:
        for b in spans:
            if a is not b and set(a["gpus"].split(",")) & set(b["gpus"].split(",")):
                assert a["t1"] <= b["t0"] or b["t1"] <= a["t0"], (a, b)  # one group per GPU at a time
    wide, narrow = [s for s in spans if "," in s["gpus"]], [s for s in spans if "," not in s["gpus"]]
    assert len(wide) == 2 and {s["gpus"] for s in wide} == {"0,1", "2,3"}  # both pairs at once, then
    assert max(s["t0"] for s in wide) < min(s["t1"] for s in wide) < min(s["t0"] for s in narrow)  # the tp-1s
    for r in recs:
        p = r.provenance.placement
        assert p.executor is ExecutorKind.gpus and len(p.gpu_ids) == r.case.tp and p.timing_scope is TimingScope.host
    (run,) = read_runs(out.parent / RUNS_FILE)
    assert run.executor.executor is ExecutorKind.gpus and sorted(next(iter(run.executor.hosts.values()))) == [
        "0",
        "1",
        "2",
        "3",
    ]


def _timed_gpus_run(tmp_path, monkeypatch, scope):
    """4 tp-1 groups on 4 GPUs, 0.3 s starts and 0.3 s per timed case; the timed spans in time order."""
    fake_smi_on_path(tmp_path, monkeypatch)
    intervals = tmp_path / "intervals"
    os.environ.update(FAKE_WORKER_INTERVALS=str(intervals), FAKE_START_S="0.3", FAKE_TIME_S="0.3")
    try:
        out, _ = run_fake(tmp_path, harness_suite(tmp_path, topks="[1, 2]"), executor="gpus", timing_scope=scope)
    finally:
        for k in ("FAKE_WORKER_INTERVALS", "FAKE_START_S", "FAKE_TIME_S"):
            os.environ.pop(k)
    assert all(r.status is Status.ok for r in read_records(out))
    spans = [json.loads(x) for x in intervals.read_text().splitlines()]
    return (
        [s for s in spans if s["kind"] == "start"],
        sorted((s for s in spans if s["kind"] == "timing"), key=lambda s: s["t0"]),
    )


def test_host_timing_scope_keeps_timed_batches_apart_across_gpus(tmp_path, monkeypatch):
    starts, timed = _timed_gpus_run(tmp_path, monkeypatch, TimingScope.host)
    assert len(timed) == 4 and all(a["t1"] <= b["t0"] for a, b in zip(timed, timed[1:]))
    assert not any(s["t0"] < t["t1"] and t["t0"] < s["t1"] for s in starts for t in timed)  # no start while timing


def test_gpu_timing_scope_lets_timed_batches_on_different_gpus_overlap(tmp_path, monkeypatch):
    _, timed = _timed_gpus_run(tmp_path, monkeypatch, TimingScope.gpu)
    assert len(timed) == 4 and any(a["t1"] > b["t0"] for a, b in zip(timed, timed[1:]))


def test_a_tp_no_island_can_hold_is_refused_before_anything_runs(tmp_path, monkeypatch):
    fake_smi_on_path(tmp_path, monkeypatch)
    suite = harness_suite(tmp_path, topks="[1]", extra="tp = [1, 2]")
    with pytest.raises(SpecwatchInputError, match=r"--gpus: tp 2 needs 2 GPUs of one NVLink island.*\[0\] \[2\]"):
        run_fake(tmp_path, suite, executor=ExecutorKind.gpus, gpu_ids=("0", "2"))
    assert not (tmp_path / "results").exists()  # nothing recorded, not even the skips
    with pytest.raises(SpecwatchInputError, match=r"tp 4 needs 4 GPUs of one NVLink island.*\[0,1\] \[2,3\]"):
        run_fake(tmp_path, harness_suite(tmp_path, topks="[1]", extra="tp = [4]"), executor="gpus")
    suite = harness_suite(tmp_path, topks="[1]", extra="tp = [4]")
    out, _ = run_fake(tmp_path, suite, executor="gpus", gpu_ids=("0", "1"))
    recs = list(read_records(out))  # wider than all the GPUs given: skipped, as on a host too small
    assert recs and all(r.status is Status.skipped and r.reason == "host: needs 4 GPUs, this host has 2" for r in recs)


def test_options_of_one_executor_are_refused_with_another():
    for bad, match in (
        (dict(executor="gpus", parallel_starts=2), "--parallel-starts overlaps engines on one GPU set"),
        (dict(gpu_ids=("0",)), "--gpus picks this host's GPUs for --executor gpus"),
        (dict(executor="gpus", ray_address="ray://head:10001"), "--address is a Ray cluster's"),
        (dict(timing_scope="gpu"), "--timing-scope gpu needs GPU sets"),
    ):
        with pytest.raises(ValueError, match=match):
            check_executor(RunOptions(**bad))


def test_local_executor_records_say_local_and_resume_continues_under_gpus(tmp_path, monkeypatch):
    """A local run leaves 4 crashed cases; ``--resume`` under ``--executor gpus`` reruns only those,
    into the same results file, and each record says which executor ran it."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    suite = harness_suite(tmp_path, topks="[1, 4]")
    out, _ = run_fake(tmp_path, suite, gpus=1)
    first = list(read_records(out))
    assert {r.provenance.placement.executor for r in first} == {ExecutorKind.local}
    assert all(r.provenance.placement.gpu_ids is None for r in first)
    fake_smi_on_path(tmp_path, monkeypatch)
    (tmp_path / "starts").unlink()
    again, _ = run_fake(tmp_path, suite, executor="gpus", resume=True)
    assert again == out
    recs = list(read_records(out))
    rerun = recs[len(first) :]
    assert len(rerun) == 4 and {r.case.topk for r in rerun} == {4}
    assert {r.provenance.placement.executor for r in rerun} == {ExecutorKind.gpus}
    assert (tmp_path / "starts").read_text().count("start") == 2 * 2  # the ok groups were not restarted
    runs = read_runs(out.parent / RUNS_FILE)
    assert [r.executor.executor for r in runs] == [ExecutorKind.local, ExecutorKind.gpus]


def _cli(tmp_path, *args, env=None):
    suite = harness_suite(tmp_path, topks="[1]", extra="tp = [1, 2]")
    return subprocess.run(
        [sys.executable, "-m", "specwatch.cli", "run", str(suite.path), "--results", str(tmp_path / "r"), *args],
        capture_output=True,
        text=True,
        env=env or dict(os.environ),
        timeout=120,
    )


@pytest.mark.parametrize(
    "args, line",
    [
        (["--executor", "slurm"], "Invalid value for '--executor'"),
        (["--executor", "gpus", "--gpus", "0,9"], "--gpus: GPU 9 is not on this host (it has 0,1,2,3"),
        (["--executor", "gpus", "--gpus", "1,2"], "--gpus: tp 2 needs 2 GPUs of one NVLink island"),
        (["--executor", "gpus", "--parallel-starts", "2"], "--parallel-starts overlaps engines on one GPU set"),
    ],
)
def test_bad_executor_options_give_one_line_and_exit_2(tmp_path, monkeypatch, args, line):
    fake_smi_on_path(tmp_path, monkeypatch)
    out = _cli(tmp_path, *args)
    assert out.returncode == 2, out.stdout + out.stderr
    assert line in out.stderr and "Traceback" not in out.stderr + out.stdout
    assert len([x for x in out.stderr.splitlines() if x.strip()]) == 1, out.stderr


def test_the_ray_executor_without_ray_says_how_to_install_it(monkeypatch):
    from specwatch.run.executors.ray_executor import RayExecutor

    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(
        SpecwatchInputError, match=r"--executor: --executor ray needs Ray: pip install 'specwatch\[ray\]'"
    ):
        RayExecutor(RunOptions(executor="ray"))


def test_a_placement_without_dispatch_time_is_written_as_before():
    import json

    from specwatch.core.placement import Placement

    local = Placement(executor=ExecutorKind.local, host="h")
    written = json.loads(local.model_dump_json())
    assert "dispatch_s" not in written and "niceness" not in written  # older readers refuse unknown keys
    ray = Placement(executor=ExecutorKind.ray, host="h", dispatch_s=0.25, niceness=15)
    back = Placement.model_validate_json(ray.model_dump_json())
    assert back.dispatch_s == 0.25 and back.niceness == 15


def test_a_ray_task_lowers_every_thread_to_the_runners_niceness_where_the_node_allows(monkeypatch):
    """Ray starts task workers at nice 15 (per thread on Linux): each thread of the task is set to 0,
    and where the node refuses (no root, no CAP_SYS_NICE) the value is reported as it is."""
    from specwatch.run.executors import ray_executor

    nice = {101: 15, 102: 15, 103: 0}
    calls = []

    def getpriority(which, who):
        return nice[who or 101]

    def setpriority(which, who, value):
        calls.append(who)
        nice[who] = value

    monkeypatch.setattr(ray_executor.os, "listdir", lambda path: ["101", "102", "103"])
    monkeypatch.setattr(ray_executor.os, "getpriority", getpriority)
    monkeypatch.setattr(ray_executor.os, "setpriority", setpriority)
    assert ray_executor.restore_priority() == 0
    assert calls == [101, 102] and set(nice.values()) == {0}  # a thread already at 0 is left alone

    def refused(which, who, value):
        raise PermissionError(13, "Permission denied")

    nice.update({101: 15, 102: 15})
    monkeypatch.setattr(ray_executor.os, "setpriority", refused)
    assert ray_executor.restore_priority() == 15
