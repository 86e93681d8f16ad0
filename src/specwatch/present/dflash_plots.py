"""The DFLASH figure beside EAGLE's: acceptance vs block size per profile, and the decode
watermark's unrecorded tail and the req_to_token row width vs page size per SGLang version."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from specwatch.core.case import Algorithm  # noqa: E402
from specwatch.core.sglang_host import version_key  # noqa: E402
from specwatch.present.plots import save_figure  # noqa: E402
from specwatch.store.latest import latest_rows  # noqa: E402

DFLASH_PLOT = "dflash"
"""File stem of the figure (``plots/dflash.png`` and ``.svg``)."""

PANELS = (
    ("accept_length", "median", "num_draft_tokens", "profile", "block size (draft tokens)", "tokens/verify"),
    ("decode_unrecorded_tail_max", "max", "page_size", "sglang_version", "page size", "tokens"),
    ("req_to_token_row_width", "median", "page_size", "sglang_version", "page size", "slots"),
)
"""(metric, aggregate over the cases at one x, x axis, one line per, x label, unit) per panel."""


def dflash_records(df: pd.DataFrame) -> pd.DataFrame:
    """The latest clean ok DFLASH record of each case per SGLang version and machine."""
    needed = {"algorithm", "status", "case_id", "sglang_version"}
    if df.empty or not needed <= set(df.columns):
        return df.iloc[0:0]
    d = df[(df.algorithm == Algorithm.DFLASH.value) & (df.status == "ok")]
    if "fault" in d:
        d = d[d.fault.isna()]
    keys = ["machine", "sglang_version", "case_id"] if "machine" in d else ["sglang_version", "case_id"]
    return latest_rows(d, keys)


def _panel(ax, d: pd.DataFrame, metric: str, how: str, x: str, line: str, xlabel: str, unit: str) -> None:
    sub = d.dropna(subset=[metric]) if metric in d else d.iloc[0:0]
    order = sorted(sub[line].unique(), key=version_key) if line == "sglang_version" else sorted(sub[line].unique())
    for key in order:
        agg = sub[sub[line] == key].groupby(x)[metric].agg(how)
        ax.plot(agg.index, agg.values, marker="o", label=f"{line.replace('sglang_version', 'SGLang')} {key}")
    if x == "page_size" and not sub.empty:
        ax.set_xscale("log", base=2)
        ticks = sorted(sub[x].unique())
        ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.set(xlabel=xlabel, ylabel=f"{metric} ({unit})", title=f"{metric}, {how} over backends and batches")
    if sub.empty:
        ax.text(0.5, 0.5, "no DFLASH records yet", ha="center", va="center", transform=ax.transAxes)
    else:
        ax.legend(fontsize=7)


def dflash_figure(df: pd.DataFrame, out: Path) -> list[Path]:
    """``plots/dflash.png``/``.svg`` from a records frame; nothing when there is no DFLASH record."""
    d = dflash_records(df)
    if d.empty:
        return []
    fig, axes = plt.subplots(1, len(PANELS), figsize=(6 * len(PANELS), 4.2))
    for ax, panel in zip(axes, PANELS):
        _panel(ax, d, *panel)
    fig.tight_layout()
    return save_figure(fig, out, DFLASH_PLOT)
