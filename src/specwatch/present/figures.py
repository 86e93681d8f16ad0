"""Every figure of the dashboard, drawn into one folder, and the title each is shown under."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from specwatch.present.dflash_plots import DFLASH_PLOT, dflash_figure
from specwatch.present.host_state_plots import HOST_STATE_PLOT, host_state_figure
from specwatch.present.plots import PLOT_PARTS
from specwatch.present.speedup_plots import SPEEDUP_PLOT, speedup_figure

PLOT_TITLES = {
    "memory_vs_topk": "req_to_token and KV reserve vs topk (analytic model lines, measured points)",
    "throughput_vs_topk": "Decode throughput vs topk per backend",
    "acceptance_vs_topk": "Acceptance length vs topk per oracle profile",
    "across_versions": "Metrics across SGLang versions",
    DFLASH_PLOT: "DFLASH: acceptance vs block size, decode watermark tail and row width vs page per SGLang version",
    SPEEDUP_PLOT: "Speedup over plain decoding vs topk, page and batch per backend (newest SGLang with twins)",
    HOST_STATE_PLOT: "Output tokens/s vs the host's slow state per timed window, probed engine starts and plain-loop runs",
}
"""Figure file stem -> the dashboard's title for it (a stem without one is shown under its own name)."""


FIGURE_PARTS = (*PLOT_PARTS, dflash_figure, speedup_figure, host_state_figure)
"""The calls that draw the figures, each ``(records frame, folder) -> files``, in the dashboard's
order; independent of each other (the dashboard shares them with a forked child: ``core.forked``)."""


def draw_figures(df: pd.DataFrame, folder: Path) -> list[Path]:
    """Every figure from a records frame into ``folder`` (``.png`` and ``.svg`` each); a figure
    without data to draw writes nothing."""
    return [p for draw in FIGURE_PARTS for p in draw(df, folder)]
