"""Speedup over plain decoding per spec case, from a records frame (the dashboard's table).

A spec record carries ``speedup`` when its plain twin was recorded before it (``store.twins``);
one whose twin finished later (``--parallel-starts``) gets it here, from the twin's latest ok row
of the same machine, SGLang version, suite, fault and probe setting (``break_even_accept_length``
alike, from the two ``step_time`` s).
"""

from __future__ import annotations

from typing import Optional

import pandas as pd

from specwatch.core.case import CASE_FIELDS, OWN_PARAMS, Algorithm
from specwatch.store.frame_dicts import row_dicts
from specwatch.store.latest import LATEST_COLUMNS, latest_rows
from specwatch.store.row_case import plain_twin_id
from specwatch.store.select import FILE_FIELDS
from specwatch.store.twins import BREAK_EVEN, SPEEDUP, STEP, THROUGHPUT

PLACE = list(FILE_FIELDS)
"""Columns a spec row and its twin's row share: one results file."""


def _twin_id(row: dict) -> str:
    """The case id of a frame row's plain twin (an own model's too, whose row holds no paths)."""
    return plain_twin_id(row)


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

READ_COLUMNS = (
    *PLACE,
    "case_id",
    *CASE_FIELDS,
    "serving_prompts",
    "model_name",
    *OWN_PARAMS,
    THROUGHPUT,
    STEP,
    SPEEDUP,
    BREAK_EVEN,
    "accept_length",
)
"""The frame columns ``speedup_points`` reads (a row's twin id, its point): only these become
Python objects, not the whole wide frame."""


def speedup_points(df: pd.DataFrame) -> pd.DataFrame:
    """One row per spec case of every suite that recorded plain twins (each case's latest ok row
    per results file): its parameters (``POINT_FIELDS``), output tokens/s, its twin's, ``speedup``
    and the break-even acceptance length beside the measured ``accept_length``. Empty when no
    twin is in ``df``."""
    return point_sets(df, None)[0]


def point_sets(df: pd.DataFrame, keep: Optional[pd.Series]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``speedup_points`` of ``df`` and of ``df[keep]`` (empty where ``keep`` is None), found in one
    pass: a spec row and its twin share the results file (``PLACE``: fault and probe setting among
    it), so the rows ``keep`` holds pick the same latest rows and twins as on their own, and a
    suite counts for them where a plain row ``keep`` holds does."""
    rows, kept = _point_rows(df, keep)
    return pd.DataFrame(rows), pd.DataFrame([r for r, k in zip(rows, kept) if k])


def _point_rows(df: pd.DataFrame, keep: Optional[pd.Series]) -> tuple[list[dict], list[bool]]:
    """``point_sets``' rows of ``df``, and per row whether it is one of ``df[keep]``'s."""
    if df.empty or "algorithm" not in df or not (df.algorithm == Algorithm.NONE.value).any():
        return [], []
    read = [c for c in dict.fromkeys([*READ_COLUMNS, *LATEST_COLUMNS]) if c in df]
    ok = latest_rows(df.loc[df.status == "ok", read], ["case_id", *PLACE])  # the columns read, cut first
    mine = pd.Series(False, index=ok.index) if keep is None else keep.loc[ok.index].astype(bool)
    plain_rows = ok.algorithm == Algorithm.NONE.value
    suites, kept_suites = set(ok.suite[plain_rows]), set(ok.suite[plain_rows & mine])
    inside = ok.suite.isin(suites)
    ok, mine = ok.loc[inside, [c for c in dict.fromkeys(READ_COLUMNS) if c in ok]], mine[inside]
    plain = {(*(r[c] for c in PLACE), r["case_id"]): r for r in row_dicts(ok[ok.algorithm == "NONE"], True)}
    spec = ok.algorithm != "NONE"
    kept = (mine[spec] & ok.suite[spec].isin(kept_suites)).tolist()
    rows = []
    for r in row_dicts(ok[spec], True):
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
    return rows, kept


def speedup_frame(df: pd.DataFrame) -> pd.DataFrame:
    """``speedup_points`` as the dashboard's table: the case's parameters in one ``case`` column."""
    return speedup_table(speedup_points(df))


def speedup_table(points: pd.DataFrame) -> pd.DataFrame:
    """``speedup_frame`` of the points ``speedup_points`` gave."""
    if points.empty:
        return points
    case = [
        f"{model} {algorithm} {backend} p{page} k{topk} bs{batch} {input_len}->{output_len} {profile}"
        for model, algorithm, backend, page, topk, batch, input_len, output_len, profile in zip(
            *(points[f].tolist() for f in POINT_FIELDS)
        )
    ]
    table = points.drop(columns=list(POINT_FIELDS))
    table.insert(2, "case", case)
    return table
