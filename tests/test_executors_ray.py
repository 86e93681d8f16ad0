"""The ``ray`` executor on a local Ray cluster with fake GPUs (``ray.init(num_gpus=4)``), driving the
fake worker: placement, a killed task's group recorded ``crashed``, ``--resume`` across executors.
Skipped where Ray is not installed (it is an optional extra: ``specwatch[ray]``)."""

import json
import os
import signal
import time

import pytest

from conftest import harness_suite

ray = pytest.importorskip("ray")

from specwatch.core.placement import ExecutorKind  # noqa: E402
from specwatch.core.record import Status  # noqa: E402
from specwatch.run.executors.ray_executor import LOST, Flight, RayExecutor  # noqa: E402
from specwatch.run.runner import RunOptions, run_suite  # noqa: E402
from specwatch.store.jsonl import RUNS_FILE, read_records, read_runs  # noqa: E402

HERE = os.path.dirname(__file__)


@pytest.fixture(scope="module")
def cluster():
    """One local Ray for the module: 4 CPUs, 4 fake GPUs (Ray hands out their ids; nothing uses them)."""
    ray.init(num_cpus=4, num_gpus=4, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _run(tmp_path, suite, **kw):
    env = {
        "PYTHONPATH": HERE + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "FAKE_WORKER_STARTS": str(tmp_path / "starts"),
        "FAKE_WORKER_PIDS": str(tmp_path / "pids"),
    }
    kw.setdefault("executor", ExecutorKind.ray)
    return run_suite(suite, tmp_path / "results", RunOptions(worker_module="fake_worker", extra_env=env, **kw))


def test_each_group_is_a_ray_task_with_its_tp_in_gpus(cluster, tmp_path):
    out = _run(tmp_path, harness_suite(tmp_path, topks="[1]", extra="tp = [1, 2]"))
    recs = list(read_records(out))
    assert len(recs) == 8 and all(r.status is Status.ok for r in recs), [(r.status, r.reason) for r in recs]
    for r in recs:
        p = r.provenance.placement
        assert p.executor is ExecutorKind.ray and p.executor_version == ray.__version__
        assert len(p.gpu_ids) == r.case.tp and p.node_id
    by_group = {}
    for r in recs:
        by_group.setdefault(r.case.engine_key(), set()).add(tuple(r.provenance.placement.gpu_ids))
    assert all(len(ids) == 1 for ids in by_group.values())  # one task per group, all its cases in it
    (run,) = read_runs(out.parent / RUNS_FILE)
    assert run.executor.executor is ExecutorKind.ray and run.records == {"ok": 8} and run.engine_groups == 4
    assert run.worker_starts == 4  # the node's worker_started events reach the driver's tally


def _task_pid_of_worker_with(tmp_path, topk: int) -> int:
    """The Ray task process whose fake worker runs the cases of ``topk`` (the worker's parent)."""
    for pid in (tmp_path / "pids").read_text().split():
        try:
            spec = open(f"/proc/{pid}/cmdline").read().split("\0")[-2]
            stat = open(f"/proc/{pid}/stat").read()
        except OSError:
            continue
        if json.load(open(spec))["cases"][0]["topk"] == topk:
            return int(stat.rsplit(")", 1)[1].split()[1])
    raise AssertionError(f"no live worker with topk {topk}")


def test_a_killed_ray_task_leaves_its_group_crashed_and_the_sweep_goes_on(cluster, tmp_path):
    """Page 64, topk 1 and 8: the topk-8 group records batch 1, then hangs on batch 8; its Ray task's
    process is killed then. Batch 8 is ``crashed`` with Ray's reason; the other group is ok."""
    killed = []

    def progress(rec):
        if rec.case.topk == 8 and rec.case.batch_size == 1 and not killed:
            killed.append(_task_pid_of_worker_with(tmp_path, 8))
            os.kill(killed[0], signal.SIGKILL)

    t0 = time.monotonic()
    suite = harness_suite(tmp_path, topks="[1, 8]", timeout_s=900)
    out = _run(tmp_path, suite, where={"page_size": {"64"}}, progress=progress)
    assert time.monotonic() - t0 < 50  # not the hung case's 60 s: the kill ended it
    recs = {(r.case.topk, r.case.batch_size): r for r in read_records(out)}
    assert killed and len(recs) == 4
    lost = recs[(8, 8)]
    assert lost.status is Status.crashed and lost.reason.startswith(LOST) and "Error" in lost.reason
    assert lost.provenance.placement.executor is ExecutorKind.ray
    assert {k: r.status for k, r in recs.items() if k != (8, 8)} == {
        (1, 1): Status.ok,
        (1, 8): Status.ok,
        (8, 1): Status.ok,
    }
    (run,) = read_runs(out.parent / RUNS_FILE)
    assert run.records == {"ok": 3, "crashed": 1}


def test_resume_under_ray_reruns_only_what_a_local_run_left_unfinished(cluster, tmp_path):
    """A local run leaves 4 cases crashed (the fake worker's scheduler death at topk 4); resumed under
    Ray, only those run again, on the cluster, where the crash is handled as locally: the case it was
    on is crashed, a fresh worker takes the rest of the group."""
    suite = harness_suite(tmp_path, topks="[1, 4]")
    out = _run(tmp_path, suite, executor=ExecutorKind.local, gpus=1)
    first = list(read_records(out))
    (tmp_path / "starts").unlink()
    assert _run(tmp_path, suite, resume=True) == out
    rerun = list(read_records(out))[len(first) :]
    assert len(rerun) == 4 and {r.case.topk for r in rerun} == {4} and {r.status for r in rerun} == {Status.crashed}
    assert all("exited with code -9" in r.reason and "scheduler died" in r.log_tail for r in rerun)
    assert {r.provenance.placement.executor for r in rerun} == {ExecutorKind.ray}
    assert (tmp_path / "starts").read_text().count("start") == 2 * 2


def test_a_lost_node_is_a_crashed_record_naming_rays_error(tmp_path):
    """What Ray raises for a task whose node died reaches the group's unrecorded cases as their reason."""
    recorded = []
    suite = harness_suite(tmp_path, topks="[1]")
    from specwatch.run.group import GroupJob

    job = GroupJob(suite, None, [p.case for p in suite.plan()][:2], recorded.append)
    ex = RayExecutor.__new__(RayExecutor)

    class DeadNode:
        exceptions = ray.exceptions

        @staticmethod
        def get(ref):
            raise ray.exceptions.NodeDiedError("node 10.0.0.7 died (heartbeats missed)")

    ex.ray = DeadNode
    assert ex._take(iter([object()]), Flight(job), hooks=None) is False
    assert [r.status for r in recorded] == [Status.crashed] * 2
    assert recorded[0].reason == LOST + "NodeDiedError: node 10.0.0.7 died (heartbeats missed)"
