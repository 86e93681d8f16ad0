"""Speedup over plain decoding vs topk, page size and batch size, one line per attention
backend, for the newest SGLang version whose records carry plain twins."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from specwatch.analysis.speedup import speedup_points
from specwatch.core.sglang_host import version_key
from specwatch.present.plots import pyplot, save_figure

SPEEDUP_PLOT = "speedup"
"""File stem of the figure (``plots/speedup.png`` and ``.svg``)."""

AXES = (("topk", "topk"), ("page_size", "page size"), ("batch_size", "batch size"))
"""(case parameter on the x axis, its label) per panel; each point is the median over the rest."""


def newest_points(df: pd.DataFrame) -> pd.DataFrame:
    """``speedup_points`` of the newest SGLang version that has any, rows without a speedup left out."""
    return newest_of(speedup_points(df))


def newest_of(points: pd.DataFrame) -> pd.DataFrame:
    """``newest_points`` of the points ``speedup_points`` gave."""
    if points.empty or "speedup" not in points:
        return points
    points = points.dropna(subset=["speedup"])
    if points.empty:
        return points
    newest = max(points.sglang.unique(), key=version_key)
    return points[points.sglang == newest]


def _panel(ax, points: pd.DataFrame, x: str, xlabel: str) -> None:
    """One panel: a line per attention backend, per model and backend where the points hold several
    models (an own model by its name), so no median runs over two models."""
    models = "model" in points and points.model.nunique() > 1
    for key, g in points.groupby(["model", "attention_backend"] if models else ["attention_backend"]):
        agg = g.groupby(x)["speedup"].median()
        ax.plot(agg.index, agg.values, marker="o", label=" ".join(map(str, key)))
    ticks = sorted(points[x].unique())
    if x == "page_size" or (x == "batch_size" and len(ticks) > 2):
        ax.set_xscale("log", base=2)
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=0.8)  # plain decoding's speed
    ax.set(xlabel=xlabel, ylabel="speedup (x plain decoding)", title=f"speedup vs {xlabel}, median over the rest")
    ax.legend(fontsize=7, title="model, backend" if models else "backend", title_fontsize=7)


def speedup_figure(df: pd.DataFrame, out: Path) -> list[Path]:
    """``plots/speedup.png``/``.svg`` from a records frame; nothing when no record has a speedup."""
    return draw_speedup(speedup_points(df), out)


def draw_speedup(points: pd.DataFrame, out: Path) -> list[Path]:
    """``speedup_figure`` of the points ``speedup_points`` gave."""
    points = newest_of(points)
    if points.empty:
        return []
    fig, axes = pyplot().subplots(1, len(AXES), figsize=(6 * len(AXES), 4.2))
    for ax, (x, label) in zip(axes, AXES):
        _panel(ax, points, x, label)
    fig.suptitle(f"SGLang {points.sglang.iloc[0]}: {len(points)} speculative cases with a plain twin", fontsize=9)
    fig.tight_layout()
    return save_figure(fig, out, SPEEDUP_PLOT)
