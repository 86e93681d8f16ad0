"""What each dashboard figure reads of the clean records: the rows and columns it draws from and the
values it finds from them (its title's release, its axis), so a figure is kept under them
(``part_cache.PartCache.files``' ``reads``) and drawn again only where they change, not where a
record it never shows is added."""

from __future__ import annotations

from typing import Callable

import pandas as pd

from specwatch.analysis.host_state import window_points
from specwatch.present.dflash_plots import PANELS, dflash_figure, dflash_records
from specwatch.present.host_state_plots import host_state_figure
from specwatch.present.plots import (
    acceptance_vs_topk,
    memory_vs_topk,
    metrics_across_versions,
    newest_release,
    newest_tiny,
    throughput_vs_topk,
)
from specwatch.present.speedup_plots import AXES, newest_of
from specwatch.present.version_history import CASE_NAME_FIELDS, VERSION_METRICS, version_lines, version_machine

MEMORY_COLUMNS = ("sglang_version", "page_size", "num_steps", "topk", "req_to_token_bytes", "model_req_to_token_bytes")
"""The columns the memory figure's measured points are found from."""

PICKED_BY = ("model", "fault", "overlap_starts", "sglang_version")
"""The columns ``plots.newest_tiny`` picks its records by."""


def columns(df: pd.DataFrame, names) -> pd.DataFrame:
    """``df``'s columns ``names`` that it has, in that order."""
    return df[[c for c in dict.fromkeys(names) if c in df]]


def memory_reads(df: pd.DataFrame) -> object:
    """``plots.memory_vs_topk``: the newest release and its records' sizing columns (cut first:
    the rows are picked from those columns alone)."""
    newest, rows = newest_release(columns(df, MEMORY_COLUMNS))
    return newest, rows


def by_topk_reads(metric: str, group: str, timed: bool) -> Callable[[pd.DataFrame], object]:
    """A by-topk figure's reads: the newest tiny release's label and records (``newest_tiny``), the
    columns it groups and plots."""

    drawn = ["batch_size", "status", metric, group, "topk"]

    def reads(df: pd.DataFrame) -> object:
        if df.empty:
            return None
        tiny, label = newest_tiny(columns(df, [*PICKED_BY, *drawn]), timed=timed)  # the columns cut first
        return label, columns(tiny, drawn)

    return reads


def across_reads(df: pd.DataFrame) -> object:
    """``plots.across_versions``: the machine it reads (``version_machine``), per metric its axis
    (``version_lines``) and the latest records of the common cases it draws, with the columns its
    lines are named by."""
    if df.empty:
        return None
    n_versions = df.sglang_version.nunique() if "sglang_version" in df else 0
    panels = []
    for m, _ in VERSION_METRICS:
        versions, labels, common, latest = version_lines(df, m)
        drawn = columns(latest, ["case_id", "sglang_version", m, *CASE_NAME_FIELDS]) if common and m in latest else None
        panels.append((m, versions, labels, len(common), drawn))
    return n_versions, version_machine(df), panels


def dflash_reads(df: pd.DataFrame) -> object:
    """``dflash_plots.dflash_figure``: the judged DFLASH records' panel columns."""
    return columns(dflash_records(df), [c for p in PANELS for c in (p[0], p[2], p[3])])


def host_state_reads(df: pd.DataFrame) -> object:
    """``host_state_plots.host_state_figure``: the windows it plots (``window_points``)."""
    return window_points(df)


FIGURE_READS: dict[Callable, Callable[[pd.DataFrame], object]] = {
    memory_vs_topk: memory_reads,
    throughput_vs_topk: by_topk_reads("decode_throughput", "attention_backend", True),
    acceptance_vs_topk: by_topk_reads("accept_length", "profile", False),
    metrics_across_versions: across_reads,
    dflash_figure: dflash_reads,
    host_state_figure: host_state_reads,
}
"""Per figure call of ``figures.FIGURE_PARTS`` but the speedup figure (``speedup_reads``), what it
reads of the clean records."""


def speedup_reads(points: pd.DataFrame) -> object:
    """``speedup_plots.draw_speedup``: the newest release's speedup points' columns it draws."""
    return columns(newest_of(points), ["sglang", "model", "attention_backend", "speedup", *(x for x, _ in AXES)])
