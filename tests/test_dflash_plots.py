"""The DFLASH figure: which records it draws and that it is drawn only when DFLASH ran."""

from __future__ import annotations

import pandas as pd

from specwatch.present.dflash_plots import DFLASH_PLOT, dflash_figure, dflash_records


def _row(case_id, version, algorithm="DFLASH", status="ok", fault=None, tail=0.0, started="2026-12-01T10:00:00Z"):
    return dict(
        case_id=case_id,
        machine="nvidia-h200-x1",
        suite="dflash",
        sglang_version=version,
        algorithm=algorithm,
        status=status,
        fault=fault,
        page_size=64,
        num_draft_tokens=16,
        profile="perfect",
        accept_length=16.0,
        decode_unrecorded_tail_max=tail,
        req_to_token_row_width=8287.0,
        started_at=pd.Timestamp(started),
        finished_at=pd.Timestamp(started),
    )


def test_dflash_records_are_the_latest_clean_ok_dflash_record_per_case_and_version():
    df = pd.DataFrame(
        [
            _row("a", "0.5.17", tail=384.0, started="2026-12-01T10:00:00Z"),
            _row("a", "0.5.17", tail=385.0, started="2026-12-01T11:00:00Z"),  # the later one wins
            _row("a", "0.5.23"),
            _row("a", "0.5.23", fault="accept-off-by-one", tail=9.0),
            _row("b", "0.5.23", algorithm="EAGLE"),
            _row("c", "0.5.23", status="crashed"),
        ]
    )
    picked = dflash_records(df)
    assert sorted(zip(picked.sglang_version, picked.decode_unrecorded_tail_max)) == [("0.5.17", 385.0), ("0.5.23", 0.0)]


def test_the_figure_is_written_only_where_dflash_ran(tmp_path):
    assert dflash_figure(pd.DataFrame([_row("b", "0.5.23", algorithm="EAGLE")]), tmp_path) == []
    paths = dflash_figure(pd.DataFrame([_row("a", "0.5.17", tail=384.0), _row("a", "0.5.23")]), tmp_path)
    assert [p.name for p in paths] == [f"{DFLASH_PLOT}.png", f"{DFLASH_PLOT}.svg"]
    assert all(p.stat().st_size > 1000 for p in paths)
