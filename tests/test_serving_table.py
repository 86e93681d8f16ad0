"""The dashboard's serving table: each serving case's latest ok record, TTFT only where every
request's first token was timed, own models by name."""

from datetime import timedelta

import pandas as pd

from records import T0, case, record
from specwatch.analysis.serving import serving_table
from specwatch.core.case import Algorithm, Workload
from specwatch.core.record import Metric, Status
from specwatch.store.frame import records_frame


def _serving(c, minutes: int, ttft: float, first_token_timed, status=Status.ok):
    why = None if status is Status.ok else "server exited"
    r = record(
        c,
        status=status,
        reason=why,
        started_at=T0 + timedelta(minutes=minutes),
        finished_at=T0 + timedelta(minutes=minutes + 1),
    )
    r.suite = "serving"
    if status is Status.ok:
        for name, v in (
            ("ttft_p50", ttft),
            ("ttft_p99", 3 * ttft),
            ("tpot_p50", 2.0),
            ("output_throughput", 1000.0 + minutes),
        ):
            r.metrics[name] = Metric(value=v, unit="ms", samples=[v], higher_is_better=name == "output_throughput")
        if first_token_timed is not None:
            r.checks["first_token_timed_every_request"] = first_token_timed
    return r


def test_latest_ok_serving_record_per_case_with_ttft_only_where_first_tokens_were_timed():
    k1 = case(workload=Workload.serving, topk=1, batch_size=8)
    k4 = case(workload=Workload.serving, topk=4, batch_size=8)
    plain = case(
        workload=Workload.serving, algorithm=Algorithm.NONE, topk=1, num_steps=1, num_draft_tokens=1, batch_size=8
    )
    offline = case(topk=1)
    recs = [
        _serving(k1, 0, 0.0, None),  # an older record: no first-token check, TTFT p50 0
        _serving(k1, 10, 30.0, True),
        _serving(k1, 20, 0.0, None, status=Status.failed),  # newer, failed: the ok one is shown
        _serving(k4, 5, 0.0, False),
        _serving(plain, 5, 25.0, True),
        record(offline),
    ]
    table = serving_table(records_frame(recs))
    assert len(table) == 3 and set(table.topk) == {1, 4}
    row = table[(table.topk == 1) & (table.algorithm == "EAGLE")].iloc[0]
    assert row["TTFT p50 ms"] == 30.0 and row["TTFT p99 ms"] == 90.0 and row["output tokens/s"] == 1010.0
    assert row["record"] == f"{k1.case_id}@20261130T001000Z" and row["concurrency"] == 8
    tree = table[table.topk == 4].iloc[0]
    assert pd.isna(tree["TTFT p50 ms"]) and tree["TPOT p50 ms"] == 2.0  # first tokens not timed: no TTFT
    assert table["accept_length"].isna().all()  # a metric no record has: an empty column


def test_no_serving_record_is_an_empty_table():
    assert serving_table(records_frame([record()])).empty
    assert serving_table(pd.DataFrame()).empty
