"""The noise check of a comparison: a pair that ran noisier than the A/A runs its floor was measured
on is named, row by row, with the change that could hide at its noise."""

import json

import pytest

from records import case, record
from specwatch.analysis.compare import compare_records
from specwatch.analysis.compare_report import markdown
from specwatch.analysis.floor import detection_floor
from specwatch.analysis.pair_noise import NOISIER_FACTOR, mark_noisier, noise_lines
from specwatch.analysis.window_spread import window_spread
from specwatch.core.case import ModelSize
from specwatch.core.record import Metric


def _windows(level, spread, n=6):
    """``n`` window samples around ``level`` whose p90 - p10 is about ``spread`` of it."""
    return [level * (1 + spread * (k / (n - 1) - 0.5) * 1.25) for k in range(n)]


def _rec(c, tps, spread, run):
    r = record(c)
    r.provenance.run_id = run
    r.metrics = {
        "decode_throughput": Metric(
            value=tps,
            unit="tokens/s",
            samples=_windows(tps, spread),
            higher_is_better=True,
            engine_medians=[tps * 0.999, tps, tps * 1.001],
        )
    }
    return r


C = case(model=ModelSize.tiny, batch_size=8)


def _aa_pairs():
    """Three A/A pairs of tiny/bs8 at a 4% window spread, their changes 1-2%."""
    return [
        ([_rec(C, 100.0, 0.04, f"{k}a")], [_rec(C, 100.0 * (1 + d), 0.04, f"{k}b")])
        for k, d in enumerate((0.01, 0.02, 0.015))
    ]


def test_window_spread_is_p90_minus_p10_over_the_median_and_needs_four_finite_samples():
    m = Metric(value=1.0, unit="s", samples=[1.0, 2.0, 3.0, 4.0, 5.0, float("nan")], higher_is_better=False)
    assert window_spread(m) == pytest.approx((4.6 - 1.4) / 3.0)
    assert window_spread(Metric(value=1.0, unit="s", samples=[1.0, 2.0, 3.0], higher_is_better=False)) is None
    assert window_spread(Metric(value=0.0, unit="s", samples=[0.0] * 4, higher_is_better=False)) is None


def test_the_floor_keeps_the_widest_window_spread_of_its_clean_pairs_only():
    pairs = _aa_pairs()
    f = detection_floor(pairs, threshold=0.02)
    assert f.spreads["tiny/bs8/decode_throughput"] == pytest.approx(
        window_spread(pairs[0][0][0].metrics["decode_throughput"])
    )
    # a pair that is no A/A (its head started 8 engines at once) lends the floor none of its noise
    noisy = [_rec(C, 101.0, 0.5, "xb")]
    noisy[0].details.parallel_starts = 8
    g = detection_floor([*pairs, ([_rec(C, 100.0, 0.04, "xa")], noisy)], threshold=0.02)
    assert g.clean_pairs == 3 and g.spreads == f.spreads


def _judged(head_spread, change=-0.01):
    floor = detection_floor(_aa_pairs(), threshold=0.02)
    rows = compare_records(
        [_rec(C, 100.0, 0.04, "pa")], [_rec(C, 100.0 * (1 + change), head_spread, "pb")], budgets=dict(floor.floors)
    )
    return floor, rows, mark_noisier(rows, floor)


def test_a_pair_past_twice_the_floors_spread_is_marked_with_the_change_that_can_hide():
    floor, rows, marked = _judged(0.40)
    (row,) = marked
    calm = floor.spreads["tiny/bs8/decode_throughput"]
    assert row.verdict.value == "unchanged" and row.spread > NOISIER_FACTOR * calm
    hidden = floor.floor("tiny/bs8", "decode_throughput") * row.spread / calm
    assert f"about {hidden:.0%} can hide" in row.note and row.noisier in row.note
    line = noise_lines(rows, floor)[0]
    assert line.startswith("**Noise check: 1 of 1") and f"tiny/bs8: up to {row.spread:.0%}" in line


def test_a_pair_as_quiet_as_the_floors_is_not_marked_and_the_report_says_the_floor_holds():
    floor, rows, marked = _judged(0.06)
    assert marked == [] and not rows[0].noisier
    assert noise_lines(rows, floor)[0].startswith("Noise check: all 1 checked timed metrics ran within 2x")


def test_a_class_no_aa_pair_measured_and_a_quiet_spread_are_not_checked():
    floor = detection_floor(_aa_pairs(), threshold=0.02)
    other = case(model=ModelSize.tiny, batch_size=16)
    rows = compare_records([_rec(other, 100.0, 0.04, "a")], [_rec(other, 100.0, 0.5, "b")])
    assert mark_noisier(rows, floor) == [] and noise_lines(rows, floor) == []
    floor.spreads = {"tiny/bs8/decode_throughput": 0.002}  # 8b-like quiet: 1.5% is still quiet
    rows = compare_records([_rec(C, 100.0, 0.002, "a")], [_rec(C, 100.0, 0.015, "b")])
    assert mark_noisier(rows, floor) == []


def test_the_report_folds_the_unchanged_rows_that_ran_noisier():
    floor, rows, _ = _judged(0.40, change=0.0)
    text = markdown(rows, "a", "b", header=floor.header() + noise_lines(rows, floor))
    assert "**Noise check: 1 of 1" in text
    assert "1 unchanged timed metric(s) that ran noisier than the floor's A/A runs" in text
    assert "can hide |" in text


def test_compare_prints_the_noise_check_from_the_suites_own_pairs(tmp_path):
    from typer.testing import CliRunner

    from specwatch.cli import app
    from specwatch.store.jsonl import append_record

    pairs = _aa_pairs()
    recs = [r for b, h in pairs for r in (*b, *h)]
    recs += [_rec(C, 100.0, 0.04, "pa"), _rec(C, 99.0, 0.40, "pb")]
    for r in recs:
        r.suite = "timing"
        append_record(tmp_path / "m" / "sglang-0.5.17" / "timing.jsonl", r)
    listed = [{"base": f"run={k}a", "head": f"run={k}b"} for k in range(3)]
    (tmp_path / "noise-budgets-timing.json").write_text(json.dumps({"pairs": listed, "budgets": {}, "threshold": 0.02}))
    res = CliRunner().invoke(app, ["compare", "suite=timing,run=pa", "suite=timing,run=pb", "--results", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert "**Noise check: 1 of 1 checked timed metrics ran noisier" in res.output
    quiet = CliRunner().invoke(
        app, ["compare", "suite=timing,run=0a", "suite=timing,run=1b", "--results", str(tmp_path)]
    )
    assert "Noise check: all 1 checked timed metrics ran within 2x" in quiet.output, quiet.output


def _timing_store(tmp_path):
    """The A/A pairs of ``_aa_pairs`` stored as the timing suite's own pairs."""
    from specwatch.store.jsonl import append_record

    for b, h in _aa_pairs():
        for r in (*b, *h):
            r.suite = "timing"
            append_record(tmp_path / "m" / "sglang-0.5.17" / "timing.jsonl", r)
    listed = [{"base": f"run={k}a", "head": f"run={k}b"} for k in range(3)]
    (tmp_path / "noise-budgets-timing.json").write_text(json.dumps({"pairs": listed, "budgets": {}, "threshold": 0.02}))


def test_a_record_is_checked_against_the_floor_its_suite_reads_as_it_lands(tmp_path):
    from specwatch.analysis.pair_noise import store_noise_check

    _timing_store(tmp_path)
    check = store_noise_check(tmp_path)
    noisy, quiet = _rec(C, 100.0, 0.40, "r"), _rec(C, 100.0, 0.05, "r")
    other = _rec(case(model=ModelSize.tiny, batch_size=16), 100.0, 0.40, "r")  # a class no pair measured
    for r in (noisy, quiet, other):
        r.suite = "timing"
    line = check(noisy)
    assert line.startswith(
        "noisy host: decode_throughput windows spread 40% against <= 4.0% in the A/A runs of tiny/bs8"
    )
    assert "(noise-budgets-timing.json)" in line and line.endswith("can hide in this record")
    assert check(quiet) is None and check(other) is None
    # where the windows kept their step distributions, the line says how much of the decode ran slow
    noisy.details.engine_starts = {
        "engines": [{"sglang_step_distribution": {"slow_share": s}} for s in (0.06, 0.75, 0.41)]
    }
    assert check(noisy).endswith(
        "can hide in this record; SGLang's decode steps ran slow 41% (6-75%, 3 windows) (store.step_state)"
    )
    smoke = _rec(C, 100.0, 0.40, "r")  # smoke reads the store's shared file, absent here
    assert check(smoke) is None


def test_the_floors_of_the_named_suites_are_found_before_the_first_record(tmp_path, monkeypatch):
    import specwatch.analysis.floor as floor_mod
    from specwatch.analysis.pair_noise import store_noise_check

    _timing_store(tmp_path)
    check = store_noise_check(tmp_path, ["timing"])

    def refuse(*a, **k):
        raise AssertionError("a floor computed while the run times its cases")

    monkeypatch.setattr(floor_mod, "store_floor", refuse)
    rec = _rec(C, 100.0, 0.40, "r")
    rec.suite = "timing"
    assert check(rec).startswith("noisy host:")


def test_run_prints_the_noisy_host_line_under_the_record(monkeypatch, capsys, tmp_path):
    from specwatch.commands.run import run_with_progress
    from specwatch.run import runner
    from specwatch.run.options import RunOptions

    _timing_store(tmp_path)
    noisy, quiet = (
        _rec(C, 100.0, 0.40, "r"),
        _rec(case(model=ModelSize.tiny, batch_size=8, input_len=64), 100.0, 0.05, "r"),
    )
    for r in (noisy, quiet):
        r.suite = "timing"

    def fake_run_suites(loaded, results, options):
        options.progress(noisy)
        options.progress(quiet)
        return []

    monkeypatch.setattr(runner, "run_suites", fake_run_suites)
    run_with_progress([], tmp_path, RunOptions())
    out = capsys.readouterr().out
    assert out.count("noisy host:") == 1
    assert out.index(noisy.case_id) < out.index("noisy host:") < out.index(quiet.case_id)


def test_run_reads_the_floors_of_another_root_when_told(monkeypatch, capsys, tmp_path):
    """``--floors``: a run into a scratch results folder still checks its records against the A/A
    runs of the committed store."""
    from specwatch.commands.run import run_with_progress
    from specwatch.run import runner
    from specwatch.run.options import RunOptions

    committed, scratch = tmp_path / "committed", tmp_path / "scratch"
    committed.mkdir()
    scratch.mkdir()
    _timing_store(committed)
    noisy = _rec(C, 100.0, 0.40, "r")
    noisy.suite = "timing"

    def fake_run_suites(loaded, results, options):
        assert results == scratch
        options.progress(noisy)
        return []

    monkeypatch.setattr(runner, "run_suites", fake_run_suites)
    run_with_progress([], scratch, RunOptions())
    assert "noisy host:" not in capsys.readouterr().out  # the scratch folder holds no A/A runs
    run_with_progress([], scratch, RunOptions(), floors=committed)
    assert capsys.readouterr().out.count("noisy host:") == 1
