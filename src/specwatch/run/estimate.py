"""What a run would still do: cases not yet recorded on a machine, their engine groups, and the
device time those cost at the machine's recorded pace (``specwatch plan --known``)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from specwatch.run.runner import engine_groups
from specwatch.store.jsonl import RUNS_FILE, read_runs, recorded_case_ids, results_path
from specwatch.suite import PlannedCase


@dataclass
class DeviceEstimate:
    """The part of a suite's plan a run on ``machine`` would still do, and its device time."""

    suite: str
    machine: str
    sglang_version: str
    known: int
    """Planned cases already recorded (any status) for this machine and SGLang version."""
    left: list[PlannedCase]
    """Planned cases not yet recorded, in plan order (skipped ones included)."""
    groups: int
    """Engine groups the runnable, non-duplicate cases of ``left`` start."""
    per_group_s: Optional[float]
    """Median wall seconds per engine group over the machine's recorded runs (None: no such run)."""
    runs: int
    """Recorded runs the pace comes from (runs a signal stopped are left out)."""

    @property
    def device_minutes(self) -> Optional[float]:
        """``groups`` x ``per_group_s`` in minutes (first-use compiles on a fresh host come on top)."""
        return None if self.per_group_s is None or not self.groups else self.groups * self.per_group_s / 60


def estimate(suite: str, planned: list[PlannedCase], root: Path, machine: str, sglang_version: str) -> DeviceEstimate:
    """Leave out the planned cases recorded under ``root`` for the machine and version, and price
    the rest's engine groups at the median wall time per group of the machine's past runs (all
    SGLang versions: the pace is the host's)."""
    done = recorded_case_ids(results_path(root, machine, sglang_version, suite))
    left = [p for p in planned if p.case.case_id not in done]
    groups = engine_groups(p.case for p in left if p.skip is None and not p.duplicate)
    runs = [
        r
        for f in sorted((Path(root) / machine).glob(f"*/{RUNS_FILE}"))
        for r in read_runs(f)
        if r.engine_groups and not r.stopped_by
    ]
    per_group = statistics.median(r.wall_s / r.engine_groups for r in runs) if runs else None
    return DeviceEstimate(
        suite, machine, sglang_version, len(planned) - len(left), left, len(groups), per_group, len(runs)
    )
