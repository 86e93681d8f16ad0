"""The host's slow state: the share of SGLang's decode steps that ran slow, per engine start and per
plain-loop run, in the overhead table and at the head of a comparison."""

import pytest

from records import case, record, rounds_record
from specwatch.analysis.host_state import SIDE_GAP, host_state_lines, side_shares
from specwatch.core.case import ModelSize
from specwatch.store.step_state import plain_windows, probed_slow_shares, shares_text

C = case(model=ModelSize.tiny, batch_size=8, topk=1)


def _dist(share):
    return {"p10": 2.8, "p50": 2.9, "slow_share": share}


def _merged(shares, run="r1", plain=None):
    """A record merged over engine starts whose windows ran ``shares`` of their steps slow, with
    sequential plain-loop rounds whose windows ran ``plain`` slow (one per round)."""
    return rounds_record(
        C,
        [[100.0]] * len(shares),
        None if plain is None else [[100.0]] * len(plain),
        run,
        engines=[{"sglang_step_distribution": _dist(s)} for s in shares],
        runs=[{"sglang_step_distribution": _dist(s)} for s in plain or []],
        paired=False,
    )


def test_shares_per_engine_start_per_plain_run_and_of_a_single_window():
    rec = _merged([0.06, 0.75, 0.41], plain=[0.51, 0.09, 0.21])
    assert probed_slow_shares(rec.details) == [0.06, 0.75, 0.41]
    assert plain_windows(rec.details.baseline)[0] == [0.51, 0.09, 0.21]
    one = record(C)
    one.details.sglang_step_times = {"entries": 9, "distribution_ms": _dist(0.3)}
    assert probed_slow_shares(one.details) == [0.3]
    # windows from before the distribution was kept: nothing, not zero
    old = _merged([0.1, 0.2])
    old.details.engine_starts["engines"][1].pop("sglang_step_distribution")
    assert probed_slow_shares(old.details) == [0.1] and probed_slow_shares(record(C).details) == []
    assert plain_windows(None) == ([], []) and plain_windows({"runs": [{"round": 0, "error": "x"}]}) == ([], [])
    assert shares_text([0.06, 0.75, 0.41]) == "41% (6-75%, 3 windows)"
    assert shares_text([0.3]) == "30% (1 window)" and shares_text([]) == "not recorded"


def test_the_overhead_table_shows_both_loops_slow_steps_pooled_over_runs():
    from specwatch.analysis.overhead import baseline_overhead_table
    from specwatch.store.frame import records_frame

    a = _merged([0.06, 0.75, 0.41], "r1", plain=[0.51, 0.09, 0.21])
    b = _merged([0.2], "r2", plain=[0.3])
    (row,) = baseline_overhead_table(records_frame([a, b])).to_dict("records")
    assert row["slow steps probed / plain"] == "30% (6-75%, 4 windows) / 26% (9-51%, 4 windows)"
    bare = _merged([0.2], "r3", plain=[0.3])
    for run in bare.details.baseline["runs"]:
        run.pop("sglang_step_distribution")
    bare.details.engine_starts["engines"][0].pop("sglang_step_distribution")
    (row,) = baseline_overhead_table(records_frame([bare])).to_dict("records")
    assert row["slow steps probed / plain"] == "not recorded"


def test_a_comparison_calls_out_sides_whose_host_state_differs():
    from specwatch.store.frame import records_frame

    base = records_frame([_merged([0.52, 0.46, 0.05], "b")])
    head = records_frame([_merged([0.17, 0.13, 0.10], "h")])
    b, h = side_shares(base), side_shares(head)
    assert b == pytest.approx([0.52, 0.46, 0.05]) and h == pytest.approx([0.17, 0.13, 0.10])
    (line, blank) = host_state_lines(b, h)
    assert line.startswith("**Host state differs between the sides**") and blank == ""
    assert "base 46% (5-52%, 3 windows), head 13% (10-17%, 3 windows)" in line
    close = [x + SIDE_GAP / 2 for x in b]
    assert host_state_lines(b, close)[0].startswith("Host state: slow steps base 46%")
    assert host_state_lines([], []) == [] and host_state_lines([], h)[0].startswith("Host state: slow steps base not")
    # each case's latest record only, as compare reads the sides
    later = _merged([0.9, 0.9], "b2")
    later.provenance.started_at = later.provenance.finished_at = later.provenance.finished_at.replace(year=2027)
    assert side_shares(records_frame([_merged([0.1], "b1"), later])) == pytest.approx([0.9, 0.9])


def test_compare_prints_the_host_state_line(tmp_path):
    from typer.testing import CliRunner

    from specwatch.cli import app
    from specwatch.store.jsonl import append_record

    for r in (_merged([0.52, 0.46, 0.05], "pa"), _merged([0.17, 0.13, 0.10], "pb")):
        append_record(tmp_path / "m" / "sglang-0.5.17" / "timing.jsonl", r)
    res = CliRunner().invoke(app, ["compare", "suite=timing,run=pa", "suite=timing,run=pb", "--results", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert "**Host state differs between the sides**: slow steps base 46%" in res.output


def test_each_window_is_a_point_with_its_loop_share_and_tokens_and_the_figure_draws_them(tmp_path):
    from specwatch.analysis.host_state import rank_correlation, window_points
    from specwatch.present.host_state_plots import HOST_STATE_PLOT, host_state_figure
    from specwatch.store.frame import records_frame

    rec = _merged([0.06, 0.75, 0.41], plain=[0.51, 0.09, 0.21])
    rec.metrics["output_throughput"].engine_medians = [7763.0, 4426.0, 6289.0]
    for run, tps in zip(rec.details.baseline["runs"], ([5000.0, 5246.0], [9935.0], [8798.0])):
        run["output_throughput"] = tps
    points = window_points(records_frame([rec]))
    assert points.loop.tolist() == ["probed"] * 3 + ["plain"] * 3
    assert points.tps.tolist() == [7763.0, 4426.0, 6289.0, 5123.0, 9935.0, 8798.0]  # a run's median call
    assert points.slow_share.tolist() == [0.06, 0.75, 0.41, 0.51, 0.09, 0.21]
    assert rank_correlation(points) == pytest.approx(1 - 6 * 64 / (6 * 35))  # rank differences squared: 64
    assert rank_correlation(points.iloc[:2]) is None
    # engine medians that do not line up with the starts give no point rather than a wrong one
    rec.metrics["output_throughput"].engine_medians = [7763.0, 4426.0]
    assert window_points(records_frame([rec])).loop.tolist() == ["plain"] * 3
    paths = host_state_figure(records_frame([rec]), tmp_path)
    assert [p.name for p in paths] == [f"{HOST_STATE_PLOT}.png", f"{HOST_STATE_PLOT}.svg"]
    assert all(p.stat().st_size > 0 for p in paths)
    assert host_state_figure(records_frame([record(C)]), tmp_path / "none") == []
