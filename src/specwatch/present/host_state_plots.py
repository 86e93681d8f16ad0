"""Output tokens/s against the host's slow state, one point per timed window: a probed engine start
or a plain-loop run (``run --baseline``), one panel per machine, model and batch size.

A window whose SGLang decode steps ran slow more often reads fewer tokens/s in either loop; where
the two loops' points fall on one curve, a gap between them is the host's, not the harness's."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from specwatch.analysis.host_state import rank_correlation, window_points
from specwatch.present.plots import pyplot, save_figure

HOST_STATE_PLOT = "host_state"
"""File stem of the figure (``plots/host_state.png`` and ``.svg``)."""

PANELS_PER_ROW = 3
"""Panels side by side before the figure wraps into another row."""

MARKERS = {"probed": ("o", "C0", "probed engine start"), "plain": ("x", "C1", "plain-loop run")}
"""Per loop: marker, colour and legend label."""


def _panel(ax, points: pd.DataFrame, title: str) -> None:
    for loop, (marker, color, label) in MARKERS.items():
        p = points[points.loop == loop]
        if not p.empty:
            ax.scatter(100 * p.slow_share, p.tps, marker=marker, color=color, label=f"{label} ({len(p)})")
    rho = rank_correlation(points)
    ax.set(
        xlabel="decode steps over 1.25x the window's p10 (%)",
        ylabel="output tokens/s",
        title=title + ("" if rho is None else f", Spearman rho {rho:.2f}"),
    )
    ax.set_xlim(-2, 102)
    ax.legend(fontsize=7)


def host_state_figure(df: pd.DataFrame, out: Path) -> list[Path]:
    """``plots/host_state.png``/``.svg`` from a records frame; nothing where no window kept its
    slow share."""
    points = window_points(df)
    if points.empty:
        return []
    groups = list(points.groupby(["machine", "model", "batch_size"], sort=True))
    cols = min(PANELS_PER_ROW, len(groups))
    rows = -(-len(groups) // cols)
    fig, axes = pyplot().subplots(rows, cols, figsize=(5.5 * cols, 4.2 * rows), squeeze=False)
    for ax, ((machine, model, batch), g) in zip(axes.flat, groups):
        _panel(ax, g, f"{model} bs{batch} on {machine}")
    for ax in list(axes.flat)[len(groups) :]:
        ax.set_visible(False)
    fig.tight_layout()
    return save_figure(fig, out, HOST_STATE_PLOT)
