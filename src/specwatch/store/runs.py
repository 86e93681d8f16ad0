"""What each GPU run cost, from the store's run summaries (``runs.ndjson``), as one frame."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from specwatch.store.jsonl import RUNS_FILE, read_runs

if TYPE_CHECKING:
    import pandas as pd


def runs_frame(root: Path) -> "pd.DataFrame":
    """What each GPU run cost (every ``runs.ndjson`` under ``root``), one row per run, oldest first:
    wall time against the cases' own time (a sweep that overlaps engine starts well stays under 2)."""
    import pandas as pd

    runs = sorted((r for p in Path(root).rglob(RUNS_FILE) for r in read_runs(p)), key=lambda r: r.started_at)
    return pd.DataFrame(
        [
            {
                "started": r.started_at.strftime("%Y-%m-%d %H:%M"),
                "machine": r.machine,
                "sglang": r.sglang_version,
                "suites": "+".join(r.suites),
                "K": f"{r.parallel_starts}{' overlap' if r.overlap_starts else ''}"
                f"{' shared lock' if r.timing_lock_shared else ''}",
                "groups": r.engine_groups,
                "workers": r.worker_starts,
                "records": sum(r.records.values()),
                "wall s": round(r.wall_s),
                "case s": round(r.case_s),
                "ratio": None if r.cost_ratio is None else round(r.cost_ratio, 2),
            }
            for r in runs
        ]
    )
