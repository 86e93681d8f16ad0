"""``--executor local``: the host's GPUs as one pool, one engine group after another, in waves
(``--parallel-starts``) or rolling (``--overlap-starts``); ``run.schedule`` has the schedules."""

from __future__ import annotations

from typing import Callable

from specwatch.core.placement import ExecutorKind
from specwatch.run.executors.base import Hooks, Placing, visible_gpu_ids
from specwatch.run.group import GroupJob
from specwatch.run.options import RunOptions
from specwatch.run.schedule import _run_rolling, _run_waves


class LocalExecutor(Placing):
    """Every group sees the GPUs this process sees (its ``CUDA_VISIBLE_DEVICES``, if set)."""

    kind = ExecutorKind.local

    def run(self, jobs: list[GroupJob], options: RunOptions, expired: Callable[[], bool], hooks: Hooks) -> None:
        """Run the jobs one after another, in waves, or rolling (``--overlap-starts``)."""
        here = self.placement(visible_gpu_ids())
        jobs = [self.placed(j, here) for j in jobs]
        if options.parallel_starts <= 1:
            for job in jobs:
                if expired():
                    break
                hooks.launch(1)
                job.run(options, hooks.event)
        elif options.overlap_starts:
            _run_rolling(jobs, options, expired, hooks.event, on_launch=hooks.launch)
        else:
            _run_waves(jobs, options, expired, hooks.event, on_wave=hooks.launch)
