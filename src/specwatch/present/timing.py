"""The dashboard's timing sections: speedup over plain decoding, the detection floor and change points."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

from specwatch.analysis.changepoints import (
    CELL,
    DASHBOARD_METRICS,
    THRESHOLD,
    history_picks,
    picks_changepoints,
    store_changepoints,
    store_picks,
)
from specwatch.analysis.floor import GOAL, DetectionFloor, store_floors
from specwatch.analysis.picks_cache import decoded_cells
from specwatch.analysis.speedup import point_sets, speedup_frame, speedup_table
from specwatch.present.figure_reads import speedup_reads
from specwatch.present.part_cache import NO_CACHE, PartCache
from specwatch.present.speedup_plots import draw_speedup
from specwatch.store.jsonl import result_files
from specwatch.store.result_cache import cached_result

if TYPE_CHECKING:
    import pandas as pd


def timing_tables(
    results: Path,
    df: "pd.DataFrame",
    points: Optional["pd.DataFrame"] = None,
    steps: Optional[Callable[[], "pd.DataFrame"]] = None,
    floors: Optional[tuple["DetectionFloor", ...]] = None,
) -> dict[str, "pd.DataFrame"]:
    """The dashboard's timing tables (titled, for ``dashboard.build``'s ``tables``): speedup over plain
    decoding per spec case, the detection floor per class and metric, and the change points of
    ``DASHBOARD_METRICS`` across releases; ``df``: the dashboard's records frame of ``results``;
    ``points``: its ``speedup_points``, where already found; ``steps``: the call that returns the
    change points (default ``store_steps``); ``floors``: the store's ``store_floors`` (one table
    per budget file: the store's and each suite's own), where already found."""

    floors = store_floors(results) if floors is None else floors
    return {
        "Speedup over plain decoding (spec output tokens/s / its no-speculation twin's; [suite] speedup)": (
            speedup_frame(df) if points is None else speedup_table(points)
        ),
        **{
            f"Detection floor ({Path(f.source or '').name}): smallest change compare calls a regression at "
            f"<= {GOAL:.0%} held-out A/A false positives ({f.margin_text()}, {f.clean_pairs} clean A/A pairs)": f.frame()
            for f in floors
        },
        "Change points across SGLang releases (asv.step_detect; specwatch changepoints)": (
            store_steps(results) if steps is None else steps()
        ),
    }


def store_steps(results: Path) -> "pd.DataFrame":
    """``store_changepoints`` of ``DASHBOARD_METRICS`` over the store's files, kept in the store
    (``store.result_cache``) while no results file changes."""
    import pandas as pd

    files = result_files(results)
    return cached_result(
        results,
        "changepoints",
        {"metrics": DASHBOARD_METRICS, "threshold": THRESHOLD},
        files,
        lambda: store_changepoints(files, DASHBOARD_METRICS),
        lambda t: t.to_dict("records"),
        pd.DataFrame,
    )


def timing_part(
    results: Path, df: "pd.DataFrame", keep: "pd.Series", plots: Path, parts: PartCache = NO_CACHE
) -> tuple[dict[str, "pd.DataFrame"], list[Path]]:
    """``timing_tables`` and the speedup figure of the clean records ``df[keep]`` drawn into
    ``plots`` (``speedup_plots.speedup_figure``), the speedup points of both found once (where
    either is not taken from ``parts``, the store's kept dashboard parts). The tables are kept
    under all they read: the speedup points, the detection floor (kept in the store under its
    own files) and the picked rows the change points read (``history_picks``, their cells as
    JSON text, decoded only where the table is computed); the change points under those picks."""
    found: list = []

    def points() -> tuple["pd.DataFrame", "pd.DataFrame"]:
        if not found:
            found.append(point_sets(df, keep))
        return found[0]

    def reads() -> tuple:  # the change points read the picks of cases of two releases or more
        picks = history_picks(store_picks(result_files(results), DASHBOARD_METRICS, raw=True))
        return points()[0], store_floors(results), picks

    def tables(read: tuple) -> dict[str, "pd.DataFrame"]:
        table, floors, picks = read

        def steps() -> "pd.DataFrame":  # kept under the picks alone: new speedup points leave it kept
            return parts.read_value(
                "changepoints", picks, lambda: picks_changepoints(decoded_cells(picks, CELL), DASHBOARD_METRICS)
            )

        return timing_tables(results, df, table, steps, floors)

    tables = parts.kept("timing", reads, tables)
    figure = parts.files(  # kept under the speedup points it draws
        "speedup_figure", plots, lambda folder: draw_speedup(points()[1], folder), lambda: speedup_reads(points()[1])
    )
    return tables, figure
