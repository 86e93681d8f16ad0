"""``--executor ray``: one Ray task per engine group on a Ray cluster (``pip install specwatch[ray]``).

Each group is a streaming-generator task with ``num_gpus`` = its tp (a one-bundle placement group
with ``STRICT_PACK`` for tp > 1, so the tp GPUs are one node's), ``max_calls=1`` (a fresh process
per group, as a local worker is) and ``max_retries=0`` (a retried group would repeat the cases it
already recorded). On its node the task runs the group exactly as the local executor does
(``run.group.run_group``: worker processes, the group's clock, a fresh worker after a crash) and
yields what happens as it happens: where it was placed, the workers' events, and every record. The
runner, on the driver, takes them with ``ray.wait`` and appends the records to its store: it stays
the only writer, so ``--resume`` works across a cluster exactly as on one host. A task that dies (its
process killed, its node lost) leaves each of its group's unrecorded cases ``crashed`` with Ray's
reason, and the sweep goes on. A group no live node can hold any more (its node lost, no other with
tp GPUs) is not left waiting: once that has lasted ``RayExecutor.unplaceable_s`` its task is
cancelled and its cases are ``crashed`` with ``UNPLACEABLE``'s reason.

Every node needs specwatch and SGLang installed, and writes the oracle checkpoints into its own
``--models-dir``: they are a few MB to a few GB, written in seconds, and identical on every node,
so no shared storage is needed (a shared ``--models-dir`` works as well).
"""

from __future__ import annotations

import os
import queue
import socket
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from specwatch.core.errors import SpecwatchInputError
from specwatch.core.placement import ExecutorKind
from specwatch.core.record import CaseRecord, Status, utcnow
from specwatch.run.case_records import failure_record
from specwatch.run.executors.base import Hooks, Placing
from specwatch.run.executors.gpus import group_env
from specwatch.run.group import GroupJob
from specwatch.run.options import RunOptions
from specwatch.run.provenance import machine_label

LOST = "ray task lost before this case finished: "
"""Start of the reason of a case whose group's Ray task died (Ray's error follows)."""

UNPLACEABLE = "ray could not place this group: "
"""Start of the reason of a case whose group no live node of the cluster could hold."""


def import_ray() -> Any:
    """The ``ray`` module, or one line saying how to install it."""
    try:
        import ray
    except ImportError:
        raise SpecwatchInputError(
            None, "--executor ray needs Ray: pip install 'specwatch[ray]'", field="--executor"
        ) from None
    return ray


def node_lock(run_key: str) -> Path:
    """This node's timing lock for the run ``run_key``, in the folder Ray keeps for the running
    cluster under its temporary root (a temporary folder of specwatch's where that cannot be read)."""
    try:
        import ray._private.worker as ray_worker

        base = Path(ray_worker._global_node.get_session_dir_path()) / "specwatch"
    except (ImportError, AttributeError):
        base = Path(tempfile.gettempdir()) / "specwatch-ray-locks"
    base.mkdir(parents=True, exist_ok=True)
    return base / f"timing-{run_key}.lock"


NICENESS = 0
"""The nice value a group's task lowers itself to: the runner's usual one. Ray starts task workers
at nice 15 (its ``worker_niceness``) and every process the group starts inherits it, so a node's
other load would take the CPU from the specwatch worker and from SGLang's scheduler, whose Python
sets a host-bound case's speed. A cluster started with ``RAY_worker_niceness=0`` needs nothing."""


def restore_priority(target: int = NICENESS) -> int:
    """Lower the nice value of this process's threads (Linux keeps one per thread) to ``target``
    where the node allows it (root, CAP_SYS_NICE, RLIMIT_NICE); returns the value the group runs at."""
    try:
        threads = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        threads = [0]
    for tid in threads:
        try:
            if os.getpriority(os.PRIO_PROCESS, tid) > target:
                os.setpriority(os.PRIO_PROCESS, tid, target)
        except OSError:  # not allowed here, or the thread ended: the value is recorded as it is
            pass
    return os.getpriority(os.PRIO_PROCESS, 0)


def group_task(job: GroupJob, options: RunOptions, machine: str, run_key: str, slots: int) -> Iterator[tuple]:
    """The Ray task (on its node): run ``job`` and yield ``("placed", {...})``, then ``("event", EV)``
    and ``("record", JSON)`` items as they happen, and ``("error", TEXT)`` if the group's run raised.
    The task first lowers its nice value (``restore_priority``) and reports it with its placement.
    Under ``--timing-scope host`` the node's groups of this run share one timing lock (``node_lock``)."""
    import ray

    began = time.time()
    os.environ["SPECWATCH_MACHINE"] = machine  # the records' machine is the results file's
    ids = [str(g) for g in ray.get_gpu_ids()]
    lock = node_lock(run_key)
    options = replace(options, extra_env=group_env(options.extra_env, ids, slots, lock, options.timing_scope))
    node = ray.get_runtime_context().get_node_id()
    niceness = restore_priority()  # before the group's thread and worker exist: they inherit it
    placed = {"host": socket.gethostname(), "gpu_ids": ids, "node_id": node, "began": began, "niceness": niceness}
    yield ("placed", placed)
    items: "queue.Queue[Optional[tuple]]" = queue.Queue()
    job = replace(job, emit=lambda rec: items.put(("record", rec.model_dump_json())))

    def body() -> None:
        try:
            job.run(options, lambda ev: items.put(("event", getattr(ev, "value", ev))))
        except Exception as e:  # noqa: BLE001 - reported to the driver, which records the cases
            items.put(("error", f"{type(e).__name__}: {e}"))
        finally:
            items.put(None)

    threading.Thread(target=body, daemon=True).start()
    while (item := items.get()) is not None:
        yield item


@dataclass
class Flight:
    """One group's task as the driver sees it."""

    job: GroupJob
    pg: Any = None
    """Its placement group (tp > 1), removed when the task ends."""
    done: set = field(default_factory=set)
    """Case ids recorded so far."""
    started: Any = field(default_factory=utcnow)
    """When the task was submitted: the start time of its lost cases' records."""
    submitted: float = field(default_factory=time.time)
    """``started`` as wall-clock seconds: the task's ``began`` minus it is Ray's dispatch time."""
    placed: bool = False
    """Whether the task has started on a node (its ``placed`` item arrived)."""
    unplaceable_since: Optional[float] = None
    """Monotonic time since which no live node has had the GPUs the group needs (None: one has)."""

    def lost(self, reason: str) -> None:
        """Every case of the group not yet recorded is ``crashed`` with ``reason``."""
        for case in self.job.cases:
            if case.case_id not in self.done:
                self.job.emit(
                    failure_record(
                        self.job.suite, case, Status.crashed, reason, None, self.job.fault, self.started, self.job.probe
                    )
                )
                self.done.add(case.case_id)


class RayExecutor(Placing):
    """Groups as Ray tasks on the cluster ``ray.init`` joins (``--address``, ``RAY_ADDRESS``, or one
    already initialized in this process)."""

    kind = ExecutorKind.ray
    unplaceable_s: float = 300.0
    """How long a group may wait while no live node has its tp GPUs (a node lost, no other as wide)
    before it is given up and its cases recorded ``crashed``; a group waiting only for busy GPUs to
    free up waits as long as that takes."""

    def __init__(self, options: RunOptions):
        self.ray = import_ray()
        self.executor_version = self.ray.__version__
        super().__init__(options.timing_scope)
        if not self.ray.is_initialized():
            self.ray.init(address=options.ray_address)
        self.task = self.ray.remote(max_calls=1, max_retries=0, num_returns="streaming")(group_task)
        nodes = [n for n in self.ray.nodes() if n.get("Alive")]
        self.node_gpus = max((int(n["Resources"].get("GPU", 0)) for n in nodes), default=0)
        self.cluster_gpus = sum(int(n["Resources"].get("GPU", 0)) for n in nodes)

    def widest_group(self, host_gpus: int) -> int:
        return self.node_gpus

    def submit(self, job: GroupJob, options: RunOptions, run_key: str) -> tuple[Any, Flight]:
        """Start ``job``'s task; returns its generator and its ``Flight``."""
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        tp = job.cases[0].tp
        flight = Flight(job)
        opts: dict = dict(num_gpus=tp, num_cpus=1)
        if tp > 1:
            flight.pg = placement_group([{"GPU": tp, "CPU": 1}], strategy="STRICT_PACK")
            opts["scheduling_strategy"] = PlacementGroupSchedulingStrategy(flight.pg, placement_group_bundle_index=0)
        task = self.task.options(**opts)
        # the driver's append stays here; the task's node may not see the results file's journal
        remote_job = replace(job, emit=None, results_file=None, on_start=None)
        gen = task.remote(remote_job, options, machine_label(), run_key, max(1, self.node_gpus))
        return gen, flight

    def run(self, jobs: list[GroupJob], options: RunOptions, expired: Callable[[], bool], hooks: Hooks) -> None:
        """Keep up to the cluster's GPU count of tasks in flight (widest tp first), take their items
        as they come (``ray.wait``), until every group ran or ``expired()``."""
        options = replace(options, progress=None, start_progress=None)
        run_key = uuid.uuid4().hex[:12]
        todo = sorted(jobs, key=lambda j: -j.cases[0].tp)
        flying: dict[Any, Flight] = {}
        checked = 0.0  # when the cluster's live nodes were last read for unplaceable groups
        while todo or flying:
            while todo and len(flying) < max(1, self.cluster_gpus) and not expired():
                gen, flight = self.submit(todo.pop(0), options, run_key)
                flying[gen] = flight
                hooks.launch(1)
            if not flying:
                break
            ready, _ = self.ray.wait(list(flying), num_returns=1, timeout=1.0)
            if ready:  # every task with an item waiting, not only the first: records land as they come
                ready, _ = self.ray.wait(list(flying), num_returns=len(flying), timeout=0)
            for gen in ready:
                if not self._take(gen, flying[gen], hooks):
                    self._land(flying.pop(gen))
            if time.monotonic() - checked >= 1.0:
                checked = time.monotonic()
                for gen in self._unplaceable(flying):
                    self._give_up(gen, flying.pop(gen))

    def _widest_live_node(self) -> tuple[int, int]:
        """GPUs of the widest live node that has a CPU, and how many nodes are alive."""
        nodes = [n for n in self.ray.nodes() if n.get("Alive")]
        gpus = [int(n["Resources"].get("GPU", 0)) for n in nodes if n["Resources"].get("CPU", 0) >= 1]
        return max(gpus, default=0), len(nodes)

    def _unplaceable(self, flying: dict[Any, Flight]) -> list[Any]:
        """The tasks not yet started that no live node could hold for ``unplaceable_s`` by now."""
        waiting = {g: f for g, f in flying.items() if not f.placed}
        if not waiting:
            return []
        widest, _ = self._widest_live_node()
        now = time.monotonic()
        out = []
        for gen, flight in waiting.items():
            if flight.job.cases[0].tp <= widest:
                flight.unplaceable_since = None
            elif flight.unplaceable_since is None:
                flight.unplaceable_since = now
            elif now - flight.unplaceable_since >= self.unplaceable_s:
                out.append(gen)
        return out

    def _give_up(self, gen: Any, flight: Flight) -> None:
        """Cancel a task no node can hold, free its placement group, record its cases ``crashed``."""
        tp = flight.job.cases[0].tp
        widest, alive = self._widest_live_node()
        try:
            self.ray.cancel(gen, force=False)
        except Exception:  # noqa: BLE001 - a task already gone needs no cancelling
            pass
        what = "its placement group was not satisfied" if flight.pg is not None else "its task was not scheduled"
        self._land(flight)
        flight.lost(
            UNPLACEABLE + f"no live node of the cluster has {tp} GPU(s) for this tp-{tp} group (the widest of "
            f"its {alive} live node(s) has {widest}) for {self.unplaceable_s:.0f} s; {what} (a node lost?)"
        )

    def _take(self, gen: Any, flight: Flight, hooks: Hooks) -> bool:
        """Handle the task's next item; False once it has ended (done, or lost)."""
        try:
            kind, payload = self.ray.get(next(gen))
        except StopIteration:
            flight.lost(LOST + "the task ended without a record for it")
            return False
        except self.ray.exceptions.RayError as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            flight.lost(LOST + f"{type(e).__name__}: {first}"[:2000])
            return False
        if kind == "placed":
            flight.placed = True
            began = payload.get("began")
            dispatch = None if began is None else round(max(0.0, began - flight.submitted), 3)
            where = self.placement(
                payload["gpu_ids"], payload["host"], payload["node_id"], dispatch, payload.get("niceness")
            )
            flight.job = self.placed(flight.job, where)
        elif kind == "event":
            hooks.event(payload)
        elif kind == "record":
            rec = CaseRecord.model_validate_json(payload)
            flight.done.add(rec.case_id)
            flight.job.emit(rec)
        elif kind == "error":
            flight.lost(LOST + payload[:2000])
        return True

    def _land(self, flight: Flight) -> None:
        """A task has ended: free its placement group."""
        if flight.pg is not None:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(flight.pg)
