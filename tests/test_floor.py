"""The detection floor: per class and metric, the smallest change compare calls a regression with
at most 1% of held-out A/A metrics flagged, from A/A pairs of known spread."""

import json

import pytest

from records import case, record
from specwatch.analysis.compare import compare_records
from specwatch.analysis.compare_report import markdown
from specwatch.analysis.floor import detection_floor, store_floor
from specwatch.core.case import ModelSize
from specwatch.core.record import Metric


def _rec(c, tps):
    r = record(c)
    r.metrics = {"output_throughput": Metric(value=tps, unit="tokens/s", samples=[tps] * 3, higher_is_better=True)}
    return r


def _pair(changes, model=ModelSize.tiny, batch=1):
    """An A/A pair of len(changes) cases; case i's head is ``changes[i]`` faster, every repeat
    apart from the base's (so the Mann-Whitney test lets it count)."""
    cases = [case(model=model, batch_size=batch, input_len=100 + i) for i in range(len(changes))]
    return [_rec(c, 100.0) for c in cases], [_rec(c, 100.0 * (1 + d)) for c, d in zip(cases, changes)]


def _pairs():
    """tiny/bs1: largest A/A change 8%, 10% and 12% in three pairs; 8b/bs8: 1% at most."""
    tiny = [_pair([0.01] * 9 + [top]) for top in (0.08, 0.10, 0.12)]
    big = [_pair([0.01, 0.005], ModelSize.llama_8b, 8) for _ in range(3)]
    return [(tb + bb, th + bh) for (tb, th), (bb, bh) in zip(tiny, big)]


def test_the_floor_is_the_smallest_margin_that_keeps_held_out_flags_at_one_percent():
    f = detection_floor(_pairs(), threshold=0.05)
    # margin 1: pair 3 under the other pairs' 10% budget flags its 12% change (1 of 36 > 1%)
    assert f.margin == 1.25 and f.held_out_rate == 0.0 and f.timed == 36 and f.clean_pairs == 3
    assert f.floors["tiny/bs1/output_throughput"] == pytest.approx(0.15)  # 1.25 x 12%
    assert f.floors["8b/bs8/output_throughput"] == 0.05  # never below the threshold
    assert f.floor("tiny/bs8", "output_throughput") == 0.05  # no A/A: the plain threshold


def test_a_change_above_the_floor_is_called_and_one_below_is_not():
    f = detection_floor(_pairs(), threshold=0.05)
    budgets = dict(f.floors)
    for change, verdict in ((0.16, "regressed"), (0.14, "unchanged")):
        base, head = _pair([-change])
        (row,) = compare_records(base, head, budgets=budgets)
        assert row.verdict.value == verdict


def test_the_report_opens_with_the_floor_of_its_classes(tmp_path):
    pairs = _pairs()
    f = detection_floor(pairs, threshold=0.05, source="noise-budgets.json")
    rows = compare_records(*pairs[0])
    text = markdown(rows, "a", "b", header=f.header(f"{r.noise_class}/{r.metric}" for r in rows if r.timed))
    lines = text.splitlines()
    assert "unchanged" in lines[2]  # the verdict counts stay on line 3
    assert lines[4].startswith("Detection floor") and "margin 1.25" in lines[4]
    assert (
        "tiny/bs1 (3 A/A pairs): output_throughput 15.0%" in lines[4]
        and "8b/bs8 (3 A/A pairs): output_throughput 5.0%" in lines[4]
    )


def test_no_budget_file_says_the_rate_is_unmeasured(tmp_path):
    f = store_floor(tmp_path)
    assert f.margin is None and "no A/A pairs" in f.header()[0] and "5%" in f.header()[0]


def _store_pairs(root, suite="smoke", dirty=None):
    """``_pairs`` stored as runs ``Ka``/``Kb`` of ``suite``; run ``dirty`` started 8 engines at
    once (its pair no A/A)."""
    from specwatch.store.jsonl import append_record

    for k, (b, h) in enumerate(_pairs()):
        for side, recs in (("a", b), ("b", h)):
            for r in recs:
                r.provenance.run_id = f"{k}{side}"
                r.details.parallel_starts = 8 if f"{k}{side}" == dirty else 1
                append_record(root / "m" / "sglang-0.5.17" / f"{suite}.jsonl", r)


def _list_pairs(path):
    """A budget file at ``path`` listing the three stored pairs."""
    pairs = [{"base": f"run={k}a", "head": f"run={k}b"} for k in range(3)]
    path.write_text(json.dumps({"pairs": pairs, "budgets": {}}))
    return path


def test_the_store_floor_reads_the_pairs_of_the_budget_file(tmp_path):
    _store_pairs(tmp_path)
    _list_pairs(tmp_path / "noise-budgets.json")
    f = store_floor(tmp_path)
    assert f.pairs == 3 and f.floors["tiny/bs1/output_throughput"] == pytest.approx(0.15)


def _floor_store(tmp_path):
    _store_pairs(tmp_path, dirty="2b")  # pair 2 is no A/A
    _list_pairs(tmp_path / "noise-budgets.json")


def test_the_store_floor_equals_the_floor_of_the_pairs_records(tmp_path):
    from specwatch.store.select import select

    _floor_store(tmp_path)
    pairs = [(select(f"run={k}a", tmp_path), select(f"run={k}b", tmp_path)) for k in range(3)]
    want, got = detection_floor(pairs), store_floor(tmp_path)
    assert got.clean_pairs == want.clean_pairs == 2
    assert (got.margin, got.held_out_rate, got.timed, got.floors) == (
        want.margin,
        want.held_out_rate,
        want.timed,
        want.floors,
    )


def test_the_store_floor_parses_no_record_on_a_warm_cache(tmp_path, monkeypatch):
    import specwatch.store.jsonl as jsonl

    _floor_store(tmp_path)
    first = store_floor(tmp_path)  # builds the Parquet caches

    def refuse(*a, **k):
        raise AssertionError("a record was parsed")

    monkeypatch.setattr(jsonl, "read_records", refuse)
    monkeypatch.setattr(jsonl, "load_records", refuse)
    import specwatch.store.select as select_mod

    monkeypatch.setattr(select_mod, "load_records", refuse)
    assert store_floor(tmp_path).floors == first.floors


def test_a_comparison_of_one_suite_reads_that_suites_own_pairs_and_the_dashboard_shows_each_file(tmp_path):
    from specwatch.analysis.floor import budget_file_for, store_floors

    _store_pairs(tmp_path, "timing")
    shared = tmp_path / "noise-budgets.json"
    assert budget_file_for(tmp_path, ["suite=timing,run=0a", "suite=timing"]) == shared  # no file of its own yet
    own = _list_pairs(tmp_path / "noise-budgets-timing.json")
    assert budget_file_for(tmp_path, ["suite=timing,run=0a", "suite=timing,fault=slow-verify-500us"]) == own
    for other in (["suite=timing", "suite=smoke"], ["suite=timing", "run=0b"], ["suite=timing", str(tmp_path / "m")]):
        assert budget_file_for(tmp_path, other) == shared
    floors = store_floors(tmp_path)
    assert [f.source for f in floors] == [str(shared), str(own)]
    assert floors[0].margin is None and floors[1].floors["tiny/bs1/output_throughput"] == pytest.approx(0.15)
    assert floors[1].floors["8b/bs8/output_throughput"] == 0.05  # never below compare's threshold
    own.write_text(json.dumps({**json.loads(own.read_text()), "threshold": 0.02}))
    assert store_floors(tmp_path)[1].floors["8b/bs8/output_throughput"] == pytest.approx(0.02)  # the file's own

    from specwatch.present.timing import timing_tables

    titles = [t for t in timing_tables(tmp_path, None, points=_no_points(), steps=lambda: None) if "floor" in t]
    assert [t.split(":")[0] for t in titles] == [
        "Detection floor (noise-budgets.json)",
        "Detection floor (noise-budgets-timing.json)",
    ]


def _no_points():
    import pandas as pd

    return pd.DataFrame()


def test_a_measured_budget_below_the_plain_threshold_is_the_one_applied():
    base, head = _pair([-0.03], ModelSize.llama_8b, 8)
    key = "8b/bs8/output_throughput"
    (row,) = compare_records(base, head, threshold=0.05, budgets={key: 0.02})
    assert row.verdict.value == "regressed"
    (row,) = compare_records(base, head, threshold=0.05, budgets={key: 0.04})
    assert row.verdict.value == "unchanged"


def test_compare_without_budgets_calls_what_its_floor_says_it_can(tmp_path):
    """The suite's file was measured at 2%: 8b/bs8's floor is 2%, and compare calls a 3% change
    there; tiny/bs1's floor is 15%, and a 10% change there is below it; a class no pair measured
    keeps compare's 5%."""
    from typer.testing import CliRunner

    from specwatch.cli import app
    from specwatch.store.jsonl import append_record

    _store_pairs(tmp_path, "timing")
    own = _list_pairs(tmp_path / "noise-budgets-timing.json")
    own.write_text(json.dumps({**json.loads(own.read_text()), "threshold": 0.02}))
    moves = [(ModelSize.llama_8b, 8, -0.03), (ModelSize.tiny, 1, -0.10), (ModelSize.tiny, 8, -0.04)]
    for model, batch, change in moves:
        base, head = _pair([change], model, batch)
        for side, recs in (("xa", base), ("xb", head)):
            for r in recs:
                r.provenance.run_id, r.suite = side, "timing"
                append_record(tmp_path / "m" / "sglang-0.5.17" / "timing.jsonl", r)
    res = CliRunner().invoke(
        app, ["compare", "suite=timing,run=xa", "suite=timing,run=xb", "--results", str(tmp_path), "--all"]
    )
    assert res.exit_code == 1, res.output
    floor_line = next(line for line in res.output.splitlines() if line.startswith("Detection floor"))
    assert (
        "8b/bs8 (3 A/A pairs): output_throughput 2.0%" in floor_line
        and "tiny/bs1 (3 A/A pairs): output_throughput 15.0%" in floor_line
    )
    assert "tiny/bs8: output_throughput 5.0% (no A/A)" in floor_line
    verdicts = {}
    for line in res.output.splitlines():
        if line.startswith("|") and "output_throughput" in line:
            cells = [c.strip() for c in line.split("|")]
            words = cells[2].split()
            verdicts[f"{words[1].split('/')[0]}/{next(w for w in words if w.startswith('bs'))}"] = cells[1]
    assert verdicts == {"8b/bs8": "regressed", "tiny/bs1": "unchanged", "tiny/bs8": "unchanged"}, res.output


def _two_metric_pair(quiet, noisy):
    """An A/A pair of tiny/bs1 cases with two timings: case i's head is ``quiet[i]`` faster in
    output tokens/s and ``noisy[i]`` faster in decode tokens/s, every repeat apart from the base's."""
    cases = [case(model=ModelSize.tiny, batch_size=1, input_len=100 + i) for i in range(len(quiet))]

    def rec(c, q, n):
        r = record(c)
        r.metrics = {
            name: Metric(value=v, unit="tokens/s", samples=[v] * 3, higher_is_better=True)
            for name, v in (("output_throughput", 100.0 * (1 + q)), ("decode_throughput", 100.0 * (1 + n)))
        }
        return r

    return [rec(c, 0.0, 0.0) for c in cases], [rec(c, q, n) for c, q, n in zip(cases, quiet, noisy)]


def test_a_noisy_metric_gets_its_own_margin_and_leaves_the_quiet_ones_floor_alone():
    """Output tokens/s moves at most 0.8-1.1% per pair, decode tokens/s 10-55%. Held out, the
    quiet metric needs margin 1.25 (1.1% against the others' 1.0%), the noisy one 2 (55% against
    30%); one global margin would be 2 for both (at 1.25 and 1.5 the noisy metric's 55% row is 1
    of 80 rows flagged, above 1%), doubling the quiet metric's floor."""
    tops = [(0.008, 0.10), (0.011, 0.55), (0.009, 0.20), (0.010, 0.30)]
    pairs = [_two_metric_pair([0.005] * 9 + [q], [0.05] * 9 + [n]) for q, n in tops]
    f = detection_floor(pairs, threshold=0.005)
    assert f.floors["tiny/bs1/output_throughput"] == pytest.approx(1.25 * 0.011)
    assert f.floors["tiny/bs1/decode_throughput"] == pytest.approx(2.0 * 0.55)
    assert f.margins == {"decode_throughput": 2.0, "output_throughput": 1.25}
    assert f.margin == 2.0 and f.held_out_rate == 0.0 and f.timed == 80
    assert "margin 1.25 (decode_throughput 2)" in f.header()[0]


def test_a_stored_floor_without_per_metric_margins_still_loads_and_reports_its_margin():
    from dataclasses import asdict

    from specwatch.analysis.floor import DetectionFloor

    d = asdict(detection_floor(_pairs(), threshold=0.05))
    del d["margins"]
    f = DetectionFloor(**d)
    assert f.margins == {} and "margin 1.25," in f.header()[0] and f.margin_text() == "margin 1.25"


def _rows(*rows):
    """One A/A pair's timed rows: (class/metric, change, spread), each testable."""
    from specwatch.analysis.floor import AARow

    return [AARow(key, change, True, spread) for key, change, spread in rows]


def test_the_scaled_budget_is_a_held_out_factor_of_the_rows_window_spread():
    from specwatch.analysis.floor import floor_of

    # tiny batch 16 on three hosts: a noisy one (20% at 35% spread), a quiet one (3% at 5%) and a
    # noisier one (7% at 40%): change / spread 0.571, 0.6 and 0.175
    pairs = [
        _rows(("tiny/bs16/decode_throughput", 0.20, 0.35)),
        _rows(("tiny/bs16/decode_throughput", 0.03, 0.05), ("tiny/bs1/probe_time_per_batch", 0.3, None)),
        _rows(("tiny/bs16/decode_throughput", 0.07, 0.40), ("tiny/bs1/probe_time_per_batch", 0.3, None)),
    ]
    f = floor_of(pairs, [True] * 3, threshold=0.02)
    # margin 1: the quiet pair under the others' 0.571 gets 2.86% < its 3%; at 1.25 none is flagged
    assert f.spread_margins == {"decode_throughput": 1.25} and f.per_spread["decode_throughput"] == pytest.approx(0.75)
    assert f.held_out_rate == 0.0 and f.timed == 5 and f.spread_min == 0.02
    # the class floor is its noisy pair's; a quiet compared row of that class gets its own noise's
    assert f.floor("tiny/bs16", "decode_throughput") == pytest.approx(f.margins["decode_throughput"] * 0.20)
    assert f.budget_at("tiny/bs16", "decode_throughput", 0.04) == pytest.approx(0.03)
    assert f.budget_at("tiny/bs16", "decode_throughput", 0.35) == pytest.approx(0.2625)
    assert f.budget_at("tiny/bs16", "decode_throughput", 0.001) == 0.02  # never below the threshold
    assert f.budget_at("tiny/bs16", "decode_throughput", None) == f.floor("tiny/bs16", "decode_throughput")
    # a metric without windows keeps its class floor
    assert "probe_time_per_batch" not in f.per_spread
    assert f.budget_at("tiny/bs1", "probe_time_per_batch", 0.1) == f.floor("tiny/bs1", "probe_time_per_batch")
    # the rule as applied is what the held-out rate counts: a pair far past its spread is flagged
    wild = [*pairs, _rows(("tiny/bs16/decode_throughput", 0.30, 0.10))]  # 3.0 x its spread
    g = floor_of(wild, [True] * 4, threshold=0.02)
    assert g.spread_margins["decode_throughput"] == 6.0  # 6 x 0.6 x 10% = 36% > 30%
    assert g.held_out_rate == 0.0
    # held out, a row of a class no other pair measured keeps the class budget, as compare gives it
    # (the plain threshold): it is flagged there and does not widen the factor's margin (scaled by
    # the others' 0.6, it would need 6); its own 3.0 lifts the factor the quiet pair is judged by
    lone = floor_of([*pairs, _rows(("tiny/bs8/decode_throughput", 0.30, 0.10))], [True] * 4, threshold=0.02)
    assert lone.spread_margins["decode_throughput"] == 1.0 and lone.held_out_rate == pytest.approx(1 / 6)


def test_compare_scales_a_rows_budget_by_its_window_spread_where_the_budgets_say_so():
    from specwatch.analysis.budget_rule import SPREAD_KEY, budget_for
    from specwatch.analysis.window_spread import window_spread

    budgets = {"tiny/bs1/output_throughput": 0.20, f"{SPREAD_KEY}output_throughput": 0.75, SPREAD_KEY: 0.02}
    assert budget_for(budgets, "tiny/bs1", "output_throughput", 0.05, 0.04) == pytest.approx(0.03)
    assert budget_for(budgets, "tiny/bs1", "output_throughput", 0.05, 0.01) == 0.02
    assert budget_for(budgets, "tiny/bs1", "output_throughput", 0.05, None) == 0.20
    assert budget_for({"tiny/bs1/output_throughput": 0.2}, "tiny/bs1", "output_throughput", 0.05, 0.04) == 0.2
    # a class no A/A pair measured keeps the plain threshold: the factor is not carried over to it
    assert budget_for(budgets, "tiny/bs16", "output_throughput", 0.05, 0.04) == 0.05

    def rec(c, scale):
        r = record(c)
        samples = [v * scale for v in (98.0, 99.0, 100.0, 100.0, 101.0, 102.0)]
        r.metrics = {
            "output_throughput": Metric(value=100.0 * scale, unit="tokens/s", samples=samples, higher_is_better=True)
        }
        return r

    c = case()
    base, head = rec(c, 1.0), rec(c, 0.95)  # 5% slower, every window below the base's
    spread = window_spread(base.metrics["output_throughput"])
    (row,) = compare_records([base], [head], threshold=0.05, budgets=budgets)
    assert row.verdict.value == "regressed" and row.spread == pytest.approx(spread)
    budget = budget_for(budgets, "tiny/bs1", "output_throughput", 0.05, spread)
    assert (
        budget == pytest.approx(0.75 * spread)
        and f"budget {budget:.1%} = 0.75 x window spread {spread:.1%}" in row.note
    )
    (row,) = compare_records([base], [head], threshold=0.05, budgets={"tiny/bs1/output_throughput": 0.20})
    assert row.verdict.value == "unchanged"  # the noisy host's class floor hides it
    # a class no pair measured: the threshold applies, and the note says so, not a scaled budget
    other = case(batch_size=16)
    (row,) = compare_records([rec(other, 1.0)], [rec(other, 0.9)], threshold=0.05, budgets=budgets)
    assert row.verdict.value == "regressed" and "no noise budget for tiny/bs16/output_throughput" in row.note
    assert "window spread" not in row.note
    # the A/A row whose change / spread set the factor (``aa_rows``: |head / base - 1|) is within its
    # own budget, not past it by rounding ((head - base) / base reads 7e-17 more at these values)
    b_tps, h_tps = 1852.1, 1958.9
    base, head = rec(c, b_tps / 100.0), rec(c, h_tps / 100.0)
    (row,) = compare_records([base], [head], threshold=0.05)
    own = {**budgets, f"{SPREAD_KEY}output_throughput": abs(row.ratio - 1) / row.spread}
    (row,) = compare_records([base], [head], threshold=0.05, budgets=own)
    assert (h_tps - b_tps) / b_tps > h_tps / b_tps - 1 and row.verdict.value == "unchanged"


def test_the_report_header_gives_the_scaled_budget_at_the_reports_spread():
    from specwatch.analysis.floor import floor_of

    f = floor_of(
        [_rows(("tiny/bs16/decode_throughput", 0.20, 0.35)), _rows(("tiny/bs16/decode_throughput", 0.03, 0.05))],
        [True, True],
        threshold=0.02,
        source="noise-budgets-timing.json",
    )
    lines = f.header(["tiny/bs16/decode_throughput"], {"tiny/bs16/decode_throughput": 0.04})
    k = f.per_spread["decode_throughput"]
    assert f"tiny/bs16 (2 A/A pairs): decode_throughput {max(0.02, k * 0.04):.1%} at 4.0% spread" in lines[0]
    assert (
        lines[2].startswith("Scaled to each compared row's window spread") and f"decode_throughput {k:.2f}" in lines[2]
    )
    assert "x window spread" in f.frame()["class"].tolist()
    assert f.frame().set_index("class").loc["tiny/bs16", "A/A pairs"] == "2" and f.class_pairs == {"tiny/bs16": 2}
    # a report of paired-class rows only keeps their class floor: no factor line
    paired = f.header(["tiny/bs16+paired/decode_throughput"])
    assert not any(line.startswith("Scaled to each") for line in paired)
