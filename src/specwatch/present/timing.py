"""The dashboard's timing sections: speedup over plain decoding, the detection floor and change points."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from specwatch.analysis.changepoints import DASHBOARD_METRICS, store_changepoints
from specwatch.analysis.floor import GOAL, store_floor
from specwatch.analysis.speedup import speedup_frame
from specwatch.store.jsonl import result_files

if TYPE_CHECKING:
    import pandas as pd


def timing_tables(results: Path, df: "pd.DataFrame") -> dict[str, "pd.DataFrame"]:
    """The dashboard's timing tables (titled, for ``dashboard.build``'s ``tables``): speedup over plain
    decoding per spec case, the detection floor per class and metric, and the change points of
    ``DASHBOARD_METRICS`` across releases; ``df``: the dashboard's records frame of ``results``."""

    floor = store_floor(results)
    steps = store_changepoints(result_files(results), DASHBOARD_METRICS)
    return {
        "Speedup over plain decoding (spec output tokens/s / its no-speculation twin's; [suite] speedup)": (
            speedup_frame(df)
        ),
        f"Detection floor: smallest change compare calls a regression at <= {GOAL:.0%} held-out A/A false "
        f"positives (margin {floor.margin}, {floor.clean_pairs} clean A/A pairs)": floor.frame(),
        "Change points across SGLang releases (asv.step_detect; specwatch changepoints)": steps,
    }
