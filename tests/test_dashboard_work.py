"""The dashboard's work grows with what it shows, not with the store: a table column's distinct
values formatted once each, the oracle's chain read off its successor cycle, the DCP markdown cut
past its column limit."""

import numpy as np
import pandas as pd


def test_a_typed_table_column_formats_each_distinct_value_once(monkeypatch):
    from specwatch.present import dashboard

    seen = []
    real = dashboard.fmt_value
    monkeypatch.setattr(dashboard, "fmt_value", lambda v: seen.append(v) or real(v))
    df = pd.DataFrame(
        {"tps": [1.5, 2.0, None] * 1000, "page": [1, 16, 64] * 1000, "st": ["ok", "crashed", "ok"] * 1000}
    )
    t = dashboard.table_view("t", df)
    assert len(seen) <= 3 * 4  # each column: its distinct values and the missing cell, once each
    assert t.rows[0] == [("1.5", "1.5"), ("1", "1.0"), ("ok", "")]
    assert t.rows[2][0] == (dashboard.NOT_MEASURED, "")


def test_a_table_column_keeps_negative_zero_apart_from_zero():
    from specwatch.present.dashboard import table_view

    t = table_view("t", pd.DataFrame({"x": [0.0, -0.0]}))
    assert [row[0][1] for row in t.rows] == ["0.0", "-0.0"]


def test_the_oracle_chain_follows_the_successor_function_step_by_step():
    from specwatch.core.case import Profile
    from specwatch.oracle.predict import Oracle
    from specwatch.oracle.shapes import FIRST_ACTIVE, SHAPES

    oracle = Oracle(SHAPES["tiny"], 0, Profile.perfect)
    succ = oracle.successor_index()
    for start in (0, 7, oracle.shape.active - 1):
        length = oracle.shape.active + 5  # past one full cycle
        walked, j = [], start
        for _ in range(length):
            walked.append(FIRST_ACTIVE + int(j))
            j = succ[j]
        assert oracle.chain(start, length) == walked
        assert oracle.chain(np.int64(start), 3) == walked[:3]


def test_dcp_markdown_cuts_a_wide_table_and_counts_the_columns_left_out(monkeypatch):
    from specwatch.analysis import dcp

    summary = pd.DataFrame({"sglang": ["0.5.17"], **{f"dcp {i}": [f"{i}/1 ok"] for i in range(1, 6)}})
    monkeypatch.setattr(dcp, "MARKDOWN_COLUMNS", 3)
    text = dcp.dcp_markdown({"dcp": (summary, summary.iloc[:, :2])})
    summary_part, matrix_part = text.split("## Matrix")
    assert "dcp 2" in summary_part and "dcp 3" not in summary_part
    assert "3 more columns: see the table on the dashboard's index page" in summary_part
    assert "more columns" not in matrix_part


def test_the_oracle_chain_draws_its_cycle_once_per_shape_and_seed(monkeypatch):
    from specwatch.core.case import Profile
    from specwatch.oracle import predict
    from specwatch.oracle.shapes import SHAPES

    oracle = predict.Oracle(SHAPES["tiny"], 3, Profile.perfect)
    drawn = []
    real = predict.Oracle.successor_index
    monkeypatch.setattr(predict.Oracle, "successor_index", lambda self: drawn.append(1) or real(self))
    chains = [oracle.chain(s, 50) for s in range(100)]
    assert drawn == []  # no permutation drawn per chain: the replay of a record's prompts reads many
    assert len({c[0] for c in chains}) == 100
