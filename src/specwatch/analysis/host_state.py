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

import pandas as pd

from specwatch.store.latest import latest_rows
from specwatch.store.select_frame import SELECT_COLUMNS, select_rows
from specwatch.store.step_state import shares_text

COLUMN = "slow_steps_probed"
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


def selection_shares(spec: str, root) -> list[float]:
    """``side_shares`` of a ``compare`` selection under the results root ``root``."""
    return side_shares(select_rows(spec, root, columns=[*SELECT_COLUMNS, COLUMN]))


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
