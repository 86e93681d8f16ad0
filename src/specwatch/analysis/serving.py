"""Serving under load per case, from a records frame (the dashboard's table).

A ``workload = "serving"`` record carries the latency percentiles SGLang's serving benchmark
reports (TTFT, TPOT, ITL in ms), output tokens/s and the server's acceptance under load; this
table puts each serving case's latest ok record on one row, with its record id.
"""

from __future__ import annotations

import pandas as pd

from specwatch.store.latest import LATEST_COLUMNS, latest_rows, record_id
from specwatch.store.select import FILE_FIELDS

PLACE = list(FILE_FIELDS)
"""Columns that name one results file: a case's latest record is taken per file."""

CASE_COLUMNS = {
    "model": "model",
    "algorithm": "algorithm",
    "attention_backend": "backend",
    "page_size": "page",
    "topk": "topk",
    "batch_size": "concurrency",
}
"""Case parameters shown, by frame column -> table header (``batch_size`` is the benchmark's
``--max-concurrency``)."""

METRIC_COLUMNS = {
    "ttft_p50": "TTFT p50 ms",
    "ttft_p90": "TTFT p90 ms",
    "ttft_p99": "TTFT p99 ms",
    "tpot_p50": "TPOT p50 ms",
    "tpot_p99": "TPOT p99 ms",
    "itl_p50": "ITL p50 ms",
    "output_throughput": "output tokens/s",
    "accept_length": "accept_length",
    "speedup": "speedup",
}
"""Metrics shown, by metric name -> table header."""

FIRST_TOKEN_CHECK = "check.first_token_timed_every_request"
"""The record's check that the benchmark timed every request's first token apart from its
others; TTFT is shown only where it passed (records made before it read TTFT p50 0 where a
request's first chunk came with later tokens)."""


def serving_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The ok serving rows of a records frame, only the columns ``serving_table`` reads (what the
    dashboard keeps the table under)."""
    if df.empty or "workload" not in df:
        return pd.DataFrame()
    rows = df[(df.workload == "serving") & (df.status == "ok")]
    wanted = [
        *PLACE,
        "case_id",
        "workload",
        "model_name",
        *CASE_COLUMNS,
        *METRIC_COLUMNS,
        FIRST_TOKEN_CHECK,
        *LATEST_COLUMNS,
    ]
    return rows[[c for c in dict.fromkeys(wanted) if c in rows]]


def serving_table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per serving case (each case's latest ok record per results file): where it ran,
    its parameters (``CASE_COLUMNS``), the latency percentiles and throughput (``METRIC_COLUMNS``;
    a metric the record lacks is empty, TTFT too where ``FIRST_TOKEN_CHECK`` did not pass) and its
    record id. Empty when ``df`` has no serving record."""
    rows = serving_rows(df)
    if rows.empty:
        return pd.DataFrame()
    latest = latest_rows(rows, ["case_id", *PLACE])
    # an own model is shown by its name (``model_name``), an oracle by its own
    model = latest.model_name.fillna(latest.model) if "model_name" in latest else latest.model
    timed = latest[FIRST_TOKEN_CHECK].eq(True) if FIRST_TOKEN_CHECK in latest else pd.Series(False, index=latest.index)
    table = pd.DataFrame(
        {
            "machine": latest.machine,
            "sglang": latest.sglang_version,
            "suite": latest.suite,
            **{header: model if col == "model" else latest[col] for col, header in CASE_COLUMNS.items()},
            **{header: _shown(latest, m, timed) for m, header in METRIC_COLUMNS.items()},
            "record": [record_id(c, t) for c, t in zip(latest.case_id, latest.started_at)],
        }
    )
    return table.sort_values(
        ["machine", "sglang", "suite", "model", "backend", "page", "topk", "concurrency"]
    ).reset_index(drop=True)


def _shown(latest: pd.DataFrame, metric: str, first_token_timed: pd.Series) -> pd.Series:
    """Column ``metric`` of ``latest`` (None where absent), TTFT only where the first token was timed."""
    if metric not in latest:
        return pd.Series(None, index=latest.index, dtype="float64")
    return latest[metric].where(first_token_timed) if metric.startswith("ttft") else latest[metric]
