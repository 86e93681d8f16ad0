"""Speedup over plain decoding per spec case, from a records frame (the dashboard's table).

A spec record carries ``speedup`` when its plain twin was recorded before it (``store.twins``);
one whose twin finished later (``--parallel-starts``) gets it here, from the twin's latest ok row
of the same machine, SGLang version, suite, fault and probe setting (``break_even_accept_length``
alike, from the two ``step_time`` s).
"""

from __future__ import annotations

import pandas as pd

from specwatch.core.case import Algorithm, Case
from specwatch.store.latest import latest_rows
from specwatch.store.row_case import derived_case_id
from specwatch.store.twins import BREAK_EVEN, SPEEDUP, STEP, THROUGHPUT

PLACE = ["machine", "sglang_version", "suite", "fault", "probe"]
"""Columns a spec row and its twin's row share: one results file."""


def _twin_id(row: dict) -> str:
    """The case id of a frame row's plain twin (an own model's too, whose row holds no paths)."""
    return derived_case_id(row, Case.plain_twin)


POINT_FIELDS = (
    "model",
    "algorithm",
    "attention_backend",
    "page_size",
    "topk",
    "batch_size",
    "input_len",
    "output_len",
    "profile",
)
"""The case parameters a speedup point keeps (what the table names and the plots group by)."""


def speedup_points(df: pd.DataFrame) -> pd.DataFrame:
    """One row per spec case of every suite that recorded plain twins (each case's latest ok row
    per results file): its parameters (``POINT_FIELDS``), output tokens/s, its twin's, ``speedup``
    and the break-even acceptance length beside the measured ``accept_length``. Empty when no
    twin is in ``df``."""
    if df.empty or "algorithm" not in df or not (df.algorithm == Algorithm.NONE.value).any():
        return pd.DataFrame()
    ok = latest_rows(df[df.status == "ok"], ["case_id", *PLACE])
    suites = set(ok.suite[ok.algorithm == Algorithm.NONE.value])
    ok = ok[ok.suite.isin(suites)].astype(object).where(ok.notna(), None)
    plain = {(*(r[c] for c in PLACE), r["case_id"]): r for r in ok[ok.algorithm == "NONE"].to_dict("records")}
    rows = []
    for r in ok[ok.algorithm != "NONE"].to_dict("records"):
        twin = plain.get((*(r[c] for c in PLACE), _twin_id(r)))
        speedup, even = r.get(SPEEDUP), r.get(BREAK_EVEN)
        if twin is not None and speedup is None and r.get(THROUGHPUT) and twin.get(THROUGHPUT):
            speedup = r[THROUGHPUT] / twin[THROUGHPUT]
            if r.get(STEP) and twin.get(STEP):
                even = r[STEP] / twin[STEP]
        rows.append(
            {
                "sglang": r["sglang_version"],
                "suite": r["suite"],
                **{f: r[f] for f in POINT_FIELDS},
                "spec tokens/s": r.get(THROUGHPUT),
                "plain tokens/s": None if twin is None else twin.get(THROUGHPUT),
                "speedup": speedup,
                "accept_length": r.get("accept_length"),
                "break-even accept_length": even,
            }
        )
    return pd.DataFrame(rows)


def speedup_frame(df: pd.DataFrame) -> pd.DataFrame:
    """``speedup_points`` as the dashboard's table: the case's parameters in one ``case`` column."""
    points = speedup_points(df)
    if points.empty:
        return points
    case = points.apply(
        lambda r: (
            f"{r['model']} {r['algorithm']} {r['attention_backend']} p{r['page_size']} k{r['topk']} "
            f"bs{r['batch_size']} {r['input_len']}->{r['output_len']} {r['profile']}"
        ),
        axis=1,
    )
    table = points.drop(columns=list(POINT_FIELDS))
    table.insert(2, "case", case)
    return table
