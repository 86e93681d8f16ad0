"""Executors: who runs the engine groups the runner plans (``specwatch run --executor``).

``local`` is the host as one pool (``run.schedule``), ``gpus`` one GPU set per group on this host,
``ray`` one Ray task per group on a cluster. Every one hands records back to the runner, the
store's only writer (``base``).
"""

from __future__ import annotations

from specwatch.core.placement import ExecutorKind
from specwatch.run.executors.base import Executor, Hooks
from specwatch.run.options import RunOptions

__all__ = ["Executor", "Hooks", "make_executor"]


def make_executor(options: RunOptions) -> Executor:
    """The executor ``options.executor`` names, set up (GPUs discovered, Ray joined)."""
    if options.executor is ExecutorKind.gpus:
        from specwatch.run.executors.gpus import GpusExecutor

        return GpusExecutor(options)
    if options.executor is ExecutorKind.ray:
        from specwatch.run.executors.ray_executor import RayExecutor

        return RayExecutor(options)
    from specwatch.run.executors.local import LocalExecutor

    return LocalExecutor(options.timing_scope)
