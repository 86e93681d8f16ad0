"""A comparison's host state: how much of each side's decode ran in the host's slow state.

A report whose sides ran their SGLang decode steps slow in different shares (``store.step_state``)
reads a throughput change that the host made: the line says so before any verdict is read, and
points to SGLang's 10th-percentile step time, which reads the fast state. On one H100 host, tiny
batch 16 in ``20261207T020257Z-a11a41``: the clean pass's three engines ran 52%, 46% and 5% of
their steps slow and read 13,338 output tokens/s; the pass with a planted 150 µs of GPU time per
verify step ran 17%, 13% and 10% slow and read 18,071.
"""

from __future__ import annotations

import statistics
from typing import Optional

import pandas as pd

from specwatch.store.latest import latest_rows
from specwatch.store.step_state import LOOPS, shares_column, shares_text, tps_column

COLUMN = shares_column("probed")
"""The records frame's column of each record's per-engine slow-step shares (``store.frame``)."""

SIDE_GAP = 0.15
"""Difference between the sides' median slow-step shares that the report calls out."""


def side_shares(rows: pd.DataFrame) -> list[float]:
    """The slow-step share of every engine start of a side's ok rows (``COLUMN``) that recorded
    one, each case's latest row only, as ``compare`` reads them."""
    if rows.empty or COLUMN not in rows:
        return []
    latest = latest_rows(rows, ["case_id"])
    return [float(x) for xs in latest.loc[latest.status == "ok", COLUMN] if xs is not None for x in list(xs)]


def host_state_lines(b: list[float], h: list[float]) -> list[str]:
    """The report's host-state line (and a blank line) for the two sides' shares (``side_shares``);
    nothing where neither side recorded one."""
    if not b and not h:
        return []
    shares = (
        f"base {shares_text(b)}, head {shares_text(h)} (SGLang's decode steps over 1.25x their window's "
        "10th percentile, per engine start)"
    )
    if b and h and abs(statistics.median(h) - statistics.median(b)) >= SIDE_GAP:
        return [
            f"**Host state differs between the sides**: slow steps {shares}. Throughput follows that "
            "share with no code changed; SGLang's 10th-percentile step time (`sglang_step_time_p10`) "
            "reads the fast state.",
            "",
        ]
    return [f"Host state: slow steps {shares}.", ""]


CASE_COLUMNS = ("machine", "model", "batch_size")
"""What a window's point is drawn under (one panel each)."""

WINDOW_COLUMNS = (*CASE_COLUMNS, *(f(loop) for loop in LOOPS for f in (shares_column, tps_column)))
"""The records frame's columns ``window_points`` reads."""


def window_points(df: pd.DataFrame) -> pd.DataFrame:
    """One row per timed window that kept its slow share and its output tokens/s: ``machine``,
    ``model``, ``batch_size``, ``loop`` (``LOOPS``), ``slow_share``, ``tps``."""
    cols = [c for c in WINDOW_COLUMNS if c in df]
    rows = []
    for rec in df[cols].to_dict("records") if not df.empty else []:
        for loop in LOOPS:
            shares, tps = rec.get(shares_column(loop)), rec.get(tps_column(loop))
            if shares is None or tps is None:
                continue
            for share, t in zip(list(shares), list(tps)):
                if t is not None and pd.notna(t) and t > 0:
                    rows.append(
                        {
                            **{k: rec.get(k) for k in CASE_COLUMNS},
                            "loop": loop,
                            "slow_share": float(share),
                            "tps": float(t),
                        }
                    )
    return pd.DataFrame(rows, columns=[*CASE_COLUMNS, "loop", "slow_share", "tps"])


def rank_correlation(points: pd.DataFrame) -> Optional[float]:
    """Spearman's rank correlation of the windows' tokens/s with their slow share (None: fewer than
    three windows, or either constant)."""
    from scipy.stats import spearmanr

    if len(points) < 3 or points.slow_share.nunique() < 2 or points.tps.nunique() < 2:
        return None
    return float(spearmanr(points.slow_share, points.tps).statistic)
