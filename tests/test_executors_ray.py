"""The ``ray`` executor on a real multi-node Ray cluster (``ray.cluster_utils.Cluster``: a head without
GPUs and two worker nodes of 2 fake GPUs each, every node its own raylet and object store on this
host), driving the fake worker: groups placed across nodes, records streamed back, a node removed
mid-sweep, a group no live node can hold any more, ``--resume`` across executors. Skipped where Ray
is not installed (it is an optional extra: ``specwatch[ray]``)."""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone

import pytest

from conftest import harness_suite

if os.environ.get("SPECWATCH_REQUIRE_RAY") == "1":  # CI: the Ray tests must run, not skip
    import ray
else:
    ray = pytest.importorskip("ray")

pytestmark = pytest.mark.xdist_group("ray")
"""One xdist worker runs the module (``--dist loadgroup``): one local cluster, not one per worker."""

from ray.cluster_utils import Cluster  # noqa: E402

from specwatch.core.placement import ExecutorKind, TimingScope  # noqa: E402
from specwatch.core.record import Status  # noqa: E402
from specwatch.run.executors.ray_executor import LOST, UNPLACEABLE, RayExecutor  # noqa: E402
from specwatch.run.runner import RunOptions, run_suite  # noqa: E402
from specwatch.store.jsonl import RUNS_FILE, read_records, read_runs  # noqa: E402

HERE = os.path.dirname(__file__)
STORE = 80 * 1024**2
"""Object store per node: the smallest Ray accepts; the items a task yields are a few kB."""
NOTICE_LOSS = {
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 500,
    "health_check_timeout_ms": 1000,
    "health_check_failure_threshold": 3,
}
"""The head's health checks of its nodes: a removed node is marked dead within a few seconds, while a
live one may miss checks for over 2 s on a loaded host and stay alive (under Ray's defaults, a check
every 3 s and 5 misses, the unplaceable-group test waits ~14 s longer for a loss)."""


def _may_lower_niceness() -> bool:
    """Whether a process here may lower its nice value (root, CAP_SYS_NICE)."""
    probe = "import os; os.nice(15); os.setpriority(os.PRIO_PROCESS, 0, 0)"
    return subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode == 0


LOWERS = _may_lower_niceness()
"""Ray starts its task workers at nice 15. Where a process may lower its nice value, the cluster
keeps that default and each group's task lowers itself (``restore_priority``); elsewhere the cluster
starts its workers at 0 (``worker_niceness``, as ``RAY_worker_niceness=0`` does). At 15 the fake
workers yield the CPU to the other pytest workers: a record took 57 s to reach the driver with three
busy processes on two cores."""


def add_gpu_node(cluster: Cluster, gpus: int = 2, cpus: int = 2):
    node = cluster.add_node(num_cpus=cpus, num_gpus=gpus, object_store_memory=STORE)
    cluster.wait_for_nodes()
    return node


def gpu_nodes(cluster: Cluster, want: int = 2) -> list:
    """The cluster's live 2-GPU worker nodes, topped up to ``want`` (a test before may have removed one)."""
    while len(cluster.worker_nodes) < want:
        add_gpu_node(cluster)
    return list(cluster.worker_nodes)


@pytest.fixture(scope="module")
def cluster():
    """One cluster for the module: the head (1 CPU, no GPU: no group lands there) and two nodes of
    2 CPUs and 2 fake GPUs each (Ray hands out their ids; nothing uses them). Its processes take
    their temporary folders (Ray's session, the groups' worker folders) under one of the module's
    own, removed at the end: the tests kill tasks and remove a node, whose folders nothing else
    removes. A short path: Ray's sockets live there."""
    scratch = tempfile.mkdtemp(prefix="sw-ray-")
    old_tmpdir = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = scratch  # read by the nodes started below and by their tasks
    c = Cluster(
        initialize_head=True,
        head_node_args=dict(
            num_cpus=1,
            num_gpus=0,
            object_store_memory=STORE,
            include_dashboard=False,
            _system_config=NOTICE_LOSS if LOWERS else {**NOTICE_LOSS, "worker_niceness": 0},
        ),
    )
    add_gpu_node(c)
    add_gpu_node(c)
    ray.init(address=c.address, log_to_driver=False)
    try:
        yield c
    finally:
        ray.shutdown()
        c.shutdown()
        if old_tmpdir is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = old_tmpdir
        shutil.rmtree(scratch, ignore_errors=True)


def _run(tmp_path, suite, env=None, **kw):
    env = {
        "PYTHONPATH": HERE + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "FAKE_WORKER_STARTS": str(tmp_path / "starts"),
        "FAKE_WORKER_PIDS": str(tmp_path / "pids"),
        **(env or {}),
    }
    kw.setdefault("executor", ExecutorKind.ray)
    return run_suite(suite, tmp_path / "results", RunOptions(worker_module="fake_worker", extra_env=env, **kw))


def _arrivals(into: list, then=None):
    """A ``progress`` hook noting (UTC time, record) as the driver appends each record."""

    def progress(rec):
        into.append((datetime.now(timezone.utc), rec))
        if then is not None:
            then(rec)

    return progress


def test_the_module_is_one_xdist_group(request):
    """Under ``--dist loadgroup`` (CI) every test here carries the module's group, so one worker runs
    them all against one cluster. pytest 9.2 with pytest-xdist 3.8 drops the group without a word
    (pytest-xdist#1386): each worker then builds a cluster of its own and both run at once
    (``pyproject.toml`` keeps pytest below 9.2 for this)."""
    if getattr(request.config.option, "loadgroup", False):  # an xdist worker under --dist loadgroup
        assert request.node.nodeid.endswith("@ray"), request.node.nodeid


def test_groups_spread_over_the_nodes_and_stream_their_records_to_the_one_writer(cluster, tmp_path):
    """Page 1 and 64 x tp 1 and 2: four groups on two 2-GPU nodes, so both nodes run groups; each
    record reaches the driver as its case ends (the fake worker goes on to the group's next case
    only once the driver has it), and the driver's results file is the only one written."""
    nodes = {n.node_id for n in gpu_nodes(cluster)}
    seen: list = []
    landed = tmp_path / "landed"
    landed.mkdir()
    # a group's time covers its cases' round trips to the driver: no 10 s limit on a loaded host
    suite = harness_suite(tmp_path, topks="[1]", extra="tp = [1, 2]", timeout_s=120)
    env = {"FAKE_AWAIT_DIR": str(landed), "FAKE_AWAIT_S": "30"}
    out = _run(tmp_path, suite, env=env, progress=_arrivals(seen, then=lambda r: (landed / r.case_id).touch()))
    recs = list(read_records(out))
    assert len(recs) == 8 and all(r.status is Status.ok for r in recs), [(r.status, r.reason) for r in recs]
    for r in recs:
        p = r.provenance.placement
        assert p.executor is ExecutorKind.ray and p.executor_version == ray.__version__
        assert len(p.gpu_ids) == r.case.tp and p.node_id in nodes
        assert 0 <= p.dispatch_s < 120  # Ray's own time from submission to the task's start
        assert p.niceness == 0  # the group, its worker and SGLang at the runner's priority, not Ray's 15
    assert {r.provenance.placement.node_id for r in recs} == nodes  # both nodes ran groups
    by_group: dict = {}
    for t, r in seen:
        by_group.setdefault((r.case.page_size, r.case.tp), []).append((t, r))
    assert all(len({r.provenance.placement.node_id for _, r in g}) == 1 for g in by_group.values())  # one task
    # streamed: every record reached the driver while its worker waited, before the group's next case
    waits = {p.stem: p.read_text() for p in landed.glob("*.await")}
    assert len(waits) == 8 and set(waits.values()) == {"streamed"}, waits
    (run,) = read_runs(out.parent / RUNS_FILE)
    assert run.executor.executor is ExecutorKind.ray and run.records == {"ok": 8} and run.engine_groups == 4
    assert run.worker_starts == 4  # the nodes' worker_started events reach the driver's tally
    root = tmp_path / "results"
    written = sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file() and p.suffix != ".lock")
    assert written == sorted([out.relative_to(root), (out.parent / RUNS_FILE).relative_to(root)])


def test_a_group_no_live_node_can_hold_is_recorded_crashed_instead_of_waiting_forever(cluster, tmp_path, monkeypatch):
    """A 4-GPU node is in the cluster when the driver joins (so tp-4 cases are planned, not skipped)
    and is lost right after; no node left has 4 GPUs. The tp-4 groups' placement groups can never be
    satisfied: after ``unplaceable_s`` their cases are ``crashed`` saying so, the tp-1 groups run ok."""
    gpu_nodes(cluster, want=1)
    wide = add_gpu_node(cluster, gpus=4, cpus=1)
    joined = RayExecutor.__init__

    def join_then_lose_the_wide_node(self, options):
        joined(self, options)
        cluster.remove_node(wide, allow_graceful=False)

    monkeypatch.setattr(RayExecutor, "__init__", join_then_lose_the_wide_node)
    monkeypatch.setattr(RayExecutor, "unplaceable_s", 2.0)
    suite = harness_suite(tmp_path, topks="[1]", extra="tp = [1, 4]", timeout_s=120)
    done: list = []
    t = threading.Thread(target=lambda: done.append(_run(tmp_path, suite)), daemon=True)
    t.start()
    t.join(timeout=60)
    assert done, "the sweep still waits for a placement group no node can satisfy"
    recs = list(read_records(done[0]))
    assert len(recs) == 8
    for r in recs:
        if r.case.tp == 4:
            assert r.status is Status.crashed and r.reason.startswith(UNPLACEABLE), (r.status, r.reason)
            assert "4 GPU(s) for this tp-4 group" in r.reason and "placement group was not satisfied" in r.reason
        else:
            assert r.status is Status.ok, (r.status, r.reason)


def test_a_node_removed_mid_sweep_crashes_its_groups_and_the_sweep_goes_on_then_resume_reruns_them(cluster, tmp_path):
    """Page 64, topk 1, 2, 3, 5, 7: five groups of two cases (batch 1 and 8) over 4 GPUs on two nodes.
    Each worker goes on to its batch-8 case only once the driver acknowledges its batch-1 record, and
    the driver holds every acknowledgement until the topk-5 group's batch-1 record arrives: then that
    group's node is removed from the cluster (its raylet and every process on it killed), so the loss
    falls while every group of the first wave runs, with the topk-7 group still queued, and only the
    other node's workers are acknowledged. The cases that node had not recorded are ``crashed`` with
    Ray's reason, every record from the other node is ok, groups still run there after the loss, and
    ``--resume`` reruns exactly the crashed cases."""
    gpu_nodes(cluster)
    lost: list = []
    held: list = []  # records whose acknowledgement waits for the loss

    def remove_its_node(rec):
        if rec.case.topk == 5 and not lost:
            node = next(n for n in cluster.worker_nodes if n.node_id == rec.provenance.placement.node_id)
            lost.append((datetime.now(timezone.utc), node.node_id))
            cluster.remove_node(node, allow_graceful=False)

    def remove_then_acknowledge(rec):
        remove_its_node(rec)
        held.append(rec)
        if lost:  # only now may a record's worker go on to its next case, on the node left
            for r in held:
                if r.provenance.placement.node_id != lost[0][1]:
                    (landed / r.case_id).touch()
            held.clear()

    seen: list = []
    landed = tmp_path / "landed"
    landed.mkdir()
    suite = harness_suite(tmp_path, topks="[1, 2, 3, 5, 7]", timeout_s=120)
    # the removed node's workers are never acknowledged: they wait until they die with their node, so
    # none writes its batch-8 case (no race between the loss and the next case)
    env = {"FAKE_AWAIT_DIR": str(landed), "FAKE_AWAIT_S": "60"}
    # under --timing-scope gpu a node's groups time at once (host scope would queue one held group's
    # node-mates behind it)
    out = _run(
        tmp_path,
        suite,
        env=env,
        where={"page_size": {"64"}},
        progress=_arrivals(seen, remove_then_acknowledge),
        timing_scope=TimingScope.gpu,
    )
    recs = {r.case.case_id: r for r in read_records(out)}
    assert lost and len(recs) == 10 == len(list(read_records(out)))  # every case once
    t_lost, dead = lost[0]
    crashed = {cid for cid, r in recs.items() if r.status is Status.crashed}
    by_key = {(r.case.topk, r.case.batch_size): r for r in recs.values()}
    assert by_key[(5, 8)].case.case_id in crashed
    for cid, r in recs.items():
        if r.provenance.placement.node_id != dead:
            assert r.status is Status.ok, (r.status, r.reason)
        elif cid in crashed:
            assert r.reason.startswith(LOST) and "Error" in r.reason, r.reason
    assert any(t > t_lost and r.provenance.placement.node_id != dead for t, r in seen)  # the sweep went on
    assert [r.status for t, r in seen if r.case.topk == 7 and t > t_lost] == [Status.ok] * 2  # queued, then run
    (run,) = read_runs(out.parent / RUNS_FILE)
    assert run.records == {"ok": 10 - len(crashed), "crashed": len(crashed)}

    assert _run(tmp_path, suite, where={"page_size": {"64"}}, resume=True) == out
    rerun = list(read_records(out))[10:]
    assert {r.case.case_id for r in rerun} == crashed and len(rerun) == len(crashed)
    assert all(r.status is Status.ok and r.provenance.placement.node_id != dead for r in rerun)


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
    gpu_nodes(cluster, want=1)
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


def test_resume_under_ray_reruns_only_what_a_local_run_left_unfinished(cluster, tmp_path):
    """A local run leaves 4 cases crashed (the fake worker's scheduler death at topk 4); resumed under
    Ray, only those run again, on the cluster, where the crash is handled as locally: the case it was
    on is crashed, a fresh worker takes the rest of the group."""
    gpu_nodes(cluster, want=1)
    suite = harness_suite(tmp_path, topks="[1, 4]", timeout_s=120)
    out = _run(tmp_path, suite, executor=ExecutorKind.local, gpus=1)
    first = list(read_records(out))
    (tmp_path / "starts").unlink()
    assert _run(tmp_path, suite, resume=True) == out
    rerun = list(read_records(out))[len(first) :]
    assert len(rerun) == 4 and {r.case.topk for r in rerun} == {4} and {r.status for r in rerun} == {Status.crashed}
    assert all("exited with code -9" in r.reason and "scheduler died" in r.log_tail for r in rerun)
    assert {r.provenance.placement.executor for r in rerun} == {ExecutorKind.ray}
    assert (tmp_path / "starts").read_text().count("start") == 2 * 2
