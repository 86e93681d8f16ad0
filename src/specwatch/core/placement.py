"""Where an engine group ran: the executor that placed it, the host and the GPUs it was given."""

from __future__ import annotations

from enum import Enum
from typing import Callable, Optional

from pydantic import BaseModel, ConfigDict, model_serializer

from specwatch.core.serial import omit_when_none


class ExecutorKind(str, Enum):
    """How ``specwatch run`` hands its engine groups out (``--executor``)."""

    local = "local"
    """One host's GPUs as one pool: one group at a time, or K at once under ``--parallel-starts``."""
    gpus = "gpus"
    """One host, N GPUs: each group on a GPU set of its own, sized by its tp."""
    ray = "ray"
    """A Ray cluster: one Ray task per group, ``num_gpus`` = its tp."""


class TimingScope(str, Enum):
    """What a timed batch excludes (``--timing-scope``)."""

    host = "host"
    """No two timed batches on one host overlap, nor a timed batch and an engine start."""
    gpu = "gpu"
    """A timed batch excludes only its own GPU set's work (each set runs one group at a time)."""


class Placement(BaseModel):
    """Where one record's engine group ran (``Provenance.placement``)."""

    model_config = ConfigDict(extra="forbid")

    executor: ExecutorKind
    """The executor that ran the group."""
    executor_version: Optional[str] = None
    """The executor's version: ray's for ``ray``, specwatch's otherwise."""
    host: str
    """Host name of the machine the group's worker ran on."""
    gpu_ids: Optional[list[str]] = None
    """The GPUs the group's worker was given, as ``CUDA_VISIBLE_DEVICES`` names them; None: not
    pinned (the worker saw the host's GPUs as the runner did)."""
    timing_scope: TimingScope = TimingScope.host
    """What the group's timed batches excluded."""
    node_id: Optional[str] = None
    """The Ray node id (``ray`` only)."""
    dispatch_s: Optional[float] = None
    """Seconds from the driver submitting the group's task to the task starting on its node
    (``ray`` only: Ray's own overhead per group, scheduling and a fresh worker process; the
    driver's and the node's wall clocks). None for the other executors."""
    niceness: Optional[int] = None
    """The nice value the group's runner, worker and SGLang processes ran at (``ray`` only: Ray
    starts its task workers at nice 15, and the task lowers it to 0 where the node allows, as root
    or with CAP_SYS_NICE; 15 here means SGLang yielded the CPU to any other load on the node).
    None for the other executors: the runner's own."""

    @model_serializer(mode="wrap")
    def _no_dispatch_no_key(self, handler: Callable) -> dict:
        """``dispatch_s`` and ``niceness`` are written only when set: a placement without them reads
        as before."""
        return omit_when_none(handler(self), "dispatch_s", "niceness")


class RunPlacement(BaseModel):
    """Where one `specwatch run` put its engine groups (``RunSummary.executor``)."""

    model_config = ConfigDict(extra="forbid")

    executor: ExecutorKind
    """The executor the run used."""
    executor_version: Optional[str] = None
    """As ``Placement.executor_version``."""
    timing_scope: TimingScope = TimingScope.host
    """What the run's timed batches excluded."""
    hosts: dict[str, list[str]] = {}
    """Host name -> the GPU ids its groups were given (an empty list: not pinned)."""

    def add(self, placement: Placement) -> None:
        """Count ``placement``'s host and GPUs in."""
        ids = self.hosts.setdefault(placement.host, [])
        for g in placement.gpu_ids or []:
            if g not in ids:
                ids.append(g)
