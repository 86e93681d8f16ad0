"""The DFLASH figure beside EAGLE's: acceptance vs block size per profile, and the decode
watermark's unrecorded tail and the req_to_token row width vs page size per SGLang version."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from specwatch.core.case import Algorithm
from specwatch.core.sglang_host import version_key
from specwatch.present.findings import latest_records
from specwatch.present.plots import pyplot, save_figure

DFLASH_PLOT = "dflash"
"""File stem of the figure (``plots/dflash.png`` and ``.svg``)."""

PANELS = (
    ("accept_length", "median", "num_draft_tokens", "profile", "block size (draft tokens)", "tokens/verify"),
    ("decode_unrecorded_tail_max", "max", "page_size", "sglang_version", "page size", "tokens"),
    ("req_to_token_row_width", "median", "page_size", "sglang_version", "page size", "slots"),
)
"""(metric, aggregate over the cases at one x, x axis, one line per, x label, unit) per panel."""


def dflash_records(df: pd.DataFrame) -> pd.DataFrame:
    """The judged record of each DFLASH case (``findings.latest_records``: the latest per machine,
    version, suite and fault, probed runs only), kept where it is clean and ok."""
    if df.empty or "algorithm" not in df:
        return df.iloc[0:0]
    d = latest_records(df[df.algorithm == Algorithm.DFLASH.value])  # a case's rows share its algorithm
    return d[(d.algorithm == Algorithm.DFLASH.value) & (d.status == "ok") & d.fault.isna()]


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
    fig, axes = pyplot().subplots(1, len(PANELS), figsize=(6 * len(PANELS), 4.2))
    for ax, panel in zip(axes, PANELS):
        _panel(ax, d, *panel)
    fig.tight_layout()
    return save_figure(fig, out, DFLASH_PLOT)
