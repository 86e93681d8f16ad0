"""Several faults in one run: each engine group's passes alternate start by start (run.interleave),
each fault's records in its own file, merged over its own engine starts only."""

import math
import os
import warnings

import pytest

from conftest import harness_suite
from records import record
from specwatch.analysis.compare import compare_records, compare_specs
from specwatch.analysis.compare_report import markdown
from specwatch.analysis.engine_test import TimedTest, paired_p, welch_p
from specwatch.core.placement import ExecutorKind
from specwatch.core.record import Metric, Status
from specwatch.run.interleave import interleaves
from specwatch.run.runner import RunOptions, run_suites
from specwatch.store.jsonl import RUNS_FILE, append_record, read_records, read_runs, results_path

HERE = os.path.dirname(__file__)
NULL = "slow-verify-0us"


def _run(tmp_path, suite, faults=(None, NULL), extra_env_more=None, **kw):
    order = tmp_path / "order"
    env = {"PYTHONPATH": HERE + os.pathsep + os.environ.get("PYTHONPATH", ""), "FAKE_ORDER": str(order)}
    env.update(extra_env_more or {})
    opts = RunOptions(gpus=1, worker_module="fake_worker", extra_env=env, faults=faults, **kw)
    outs = run_suites([suite], tmp_path / "results", opts)
    lines = order.read_text().splitlines() if order.exists() else []
    order.unlink(missing_ok=True)
    return {f: list(read_records(out)) for f, out in zip(faults, outs)}, lines


def test_engine_starts_alternate_between_the_faults_round_by_round(tmp_path):
    suite = harness_suite(tmp_path, topks="[1]", header="engine_starts = 3")
    recs, order = _run(tmp_path, suite)
    a, b = "probed", f"probed {NULL} p1"
    one_group = [a, b, b, a, a, b]  # serpentine: none0 null0 null1 none1 none2 null2
    assert order == one_group + [line.replace("p1", "p64") for line in one_group]
    for fault, rs in recs.items():
        assert len(rs) == 4 and all(r.status is Status.ok and r.provenance.fault == fault for r in rs)
        assert all(
            r.details["interleaved"] == {"faults": ["none", NULL], "rounds": 3, "order": "serpentine"} for r in rs
        )
        assert all(len(r.metrics["output_throughput"].engine_medians) == 3 for r in rs)  # its own starts only
    (summary,) = read_runs(next((tmp_path / "results").rglob(RUNS_FILE)))
    assert not summary.stopped_early and summary.engine_groups == 2  # two groups, each interleaved


@pytest.mark.parametrize("starts", [1, 2])
def test_two_paired_passes_run_each_round_at_once_taking_turns_unit_by_unit(tmp_path, starts):
    """``--paired`` with two ``--fault`` passes: each round's two workers are up together and take
    turns (``core.turns``): no two units overlap, and they alternate but where a round starts."""
    log = tmp_path / "turns.log"
    suite = harness_suite(tmp_path, topks="[1]", header=f"engine_starts = {starts}")
    recs, _ = _run(tmp_path, suite, paired=True, extra_env_more={"FAKE_TURN_UNITS": "2", "FAKE_TURNS_LOG": str(log)})
    for fault, rs in recs.items():
        assert len(rs) == 4 and all(r.status is Status.ok and r.provenance.fault == fault for r in rs)
        assert all(r.details["interleaved"]["order"] == "paired" for r in rs)
    lines = [x.split() for x in log.read_text().splitlines()]
    assert {(who, side) for who, _, _, _, side in lines} == {("probed:none", "a"), (f"probed:{NULL}", "b")}
    units = sorted((float(t0), float(t1), who) for who, _, t0, t1, _ in lines)  # the first pass leads
    assert len(units) == 2 * starts * 2 * 2 * 2  # groups x rounds x cases x units x passes
    assert {u[2] for u in units} == {"probed:none", f"probed:{NULL}"}
    assert all(a[1] <= b[0] for a, b in zip(units, units[1:]))  # never two at once
    assert sum(a[2] == b[2] for a, b in zip(units, units[1:])) <= 2 * starts  # alternating but at a round's start


def test_one_engine_start_per_fault_alternates_group_by_group(tmp_path):
    suite = harness_suite(tmp_path, topks="[1]")
    recs, order = _run(tmp_path, suite, faults=(None, NULL, "slow-verify-gpu-500us"))
    assert order == [
        "probed", f"probed {NULL} p1", "probed slow-verify-gpu-500us p1",
        "probed", f"probed {NULL} p64", "probed slow-verify-gpu-500us p64",
    ]  # fmt: skip
    assert [len(rs) for rs in recs.values()] == [4, 4, 4]
    assert all("engine_starts" not in r.details for rs in recs.values() for r in rs)


def test_a_crash_is_recorded_under_the_fault_of_the_pass_it_happened_in(tmp_path):
    suite = harness_suite(tmp_path, topks="[4]", header="engine_starts = 2")  # topk 4: the fake worker dies
    recs, _ = _run(tmp_path, suite)
    for fault, rs in recs.items():
        assert len(rs) == 4 and all(r.status is Status.crashed and r.provenance.fault == fault for r in rs)
        assert all(r.details["engine_starts"]["not_ok_on"] == 1 for r in rs)


def test_resume_interleaves_only_the_groups_each_fault_still_needs(tmp_path):
    suite = harness_suite(tmp_path, topks="[1]")
    _run(tmp_path, suite, faults=(NULL,))  # the null pass is done: only the clean pass is left
    recs, order = _run(tmp_path, suite, resume=True)
    assert order == ["probed", "probed"]
    assert len(recs[None]) == 4 and "interleaved" not in recs[None][0].details  # ran alone: nothing to alternate
    assert len(recs[NULL]) == 4


def test_only_several_faults_on_this_hosts_executors_interleave():
    assert interleaves(RunOptions(faults=(None, NULL)))
    assert interleaves(RunOptions(faults=(None, NULL), executor=ExecutorKind.gpus))
    assert not interleaves(RunOptions(faults=(None,)))
    assert not interleaves(RunOptions(faults=(None, NULL), executor=ExecutorKind.ray))


# -- compare: engines paired round by round --------------------------------------------------------

DRIFTING = [700.0, 910.0, 560.0]
"""A clean pass's engine medians over three rounds on a host whose speed drifts 30% between rounds."""
SLOWED = [v * r for v, r in zip(DRIFTING, (0.95, 0.955, 0.945))]
"""The slowed pass beside it in each round: 4.5-5.5% slower than its round's clean engine."""


def _interleaved(medians, fault=None, run_id="R1"):
    r = record(tps=sorted(medians)[1], run_id=run_id, fault=fault)
    r.metrics["output_throughput"] = Metric(
        value=sorted(medians)[1],
        unit="tokens/s",
        samples=[x + d for x in medians for d in (-2.0, 0.0, 2.0)],
        higher_is_better=True,
        engine_medians=list(medians),
    )
    r.details["interleaved"] = {"faults": ["none", "slow-verify-gpu-500us"], "rounds": 3}
    return r


def _row(rows):
    return next(r for r in rows if r.metric == "output_throughput")


def test_a_slowdown_paired_round_by_round_is_called_where_unpaired_engines_hide_it_in_the_drift():
    assert paired_p(tuple(DRIFTING), tuple(SLOWED)) < 0.01 < 0.1 < welch_p(tuple(DRIFTING), tuple(SLOWED))
    row = _row(compare_records([_interleaved(DRIFTING)], [_interleaved(SLOWED, "slow-verify-gpu-500us")], 0.03))
    assert row.test is TimedTest.paired_rounds and row.verdict.value == "regressed"
    assert "paired t, 3 interleaved rounds" in row.note
    other_run = _interleaved(SLOWED, "slow-verify-gpu-500us", run_id="R2")  # not side by side: unpaired
    row = _row(compare_records([_interleaved(DRIFTING)], [other_run], 0.03))
    assert row.test is TimedTest.engine_medians and row.verdict.value == "unchanged"


def test_pairs_need_interleaved_records_of_one_run_with_as_many_engines():
    plain_b, plain_h = _interleaved(DRIFTING), _interleaved(SLOWED)
    del plain_b.details["interleaved"], plain_h.details["interleaved"]
    assert _row(compare_records([plain_b], [plain_h])).test is TimedTest.engine_medians
    assert _row(compare_records([_interleaved(DRIFTING)], [_interleaved(SLOWED[:2])])).test is TimedTest.engine_medians
    assert paired_p((100.0, 120.0), (100.0, 120.0)) == 1.0 and paired_p((100.0, 120.0), (90.0, 108.0)) == 0.0


def test_paired_rounds_reach_compare_through_the_store_frame_and_the_report_says_so(tmp_path):
    for fault, meds in ((None, DRIFTING), ("slow-verify-gpu-500us", SLOWED)):
        r = _interleaved(meds, fault)
        append_record(results_path(tmp_path, "m", "0.5.17", r.suite, fault, True), r)
    rows = compare_specs("suite=smoke", "suite=smoke,fault=slow-verify-gpu-500us", tmp_path, threshold=0.03)
    assert _row(rows).test is TimedTest.paired_rounds and _row(rows).verdict.value == "regressed"
    assert "tested round by round (paired t" in markdown(rows, "b", "h")


TURNS_CLEAN = [20022.5, 19681.5, 17821.4]
TURNS_NULL = [19292.7, 19221.9, 18365.0]
"""Decode tok/s engine medians of a paired A/A pair on an H100 host (clean against the null fault,
taking turns; run 20261207T145405Z-b72caf): their medians differ 2.3%, their rounds 1.0%."""


def _turns(medians, fault=None, order="paired"):
    r = _interleaved(medians, fault)
    r.details["interleaved"] = {"faults": ["none", "slow-verify-0us"], "rounds": 3, "order": order}
    return r


def test_passes_that_took_turns_are_judged_on_their_round_ratios_in_a_class_of_their_own(tmp_path):
    from specwatch.analysis.noise_class import PAIRED_SUFFIX, noise_class

    rows = compare_records([_turns(TURNS_CLEAN)], [_turns(TURNS_NULL, "slow-verify-0us")], 0.02)
    row = _row(rows)
    gm = math.exp(sum(math.log(h / b) for b, h in zip(TURNS_CLEAN, TURNS_NULL)) / 3)
    assert row.round_ratio == pytest.approx(gm) and row.ratio == pytest.approx(0.9899, abs=1e-4)
    assert row.head / row.base == pytest.approx(0.9766, abs=1e-4)  # the medians alone read -2.3%
    assert row.noise_class == noise_class(_turns(TURNS_CLEAN).case) + PAIRED_SUFFIX
    assert row.spread is None  # its floor is its class's, not scaled to the window spread
    assert "-1.0% within 2%" in row.note
    # a budget of the plain class does not reach it; one of the paired class does
    plain = noise_class(_turns(TURNS_CLEAN).case)
    budgets = {f"{plain}/output_throughput": 0.3, f"{row.noise_class}/output_throughput": 0.03}
    row = _row(compare_records([_turns(DRIFTING)], [_turns(SLOWED, "slow-verify-gpu-500us")], 0.02, 0.1, budgets))
    assert row.verdict.value == "regressed" and row.note.startswith("-5.0%, p=0.00")
    budgets[f"{row.noise_class}/output_throughput"] = 0.06
    row = _row(compare_records([_turns(DRIFTING)], [_turns(SLOWED, "slow-verify-gpu-500us")], 0.02, 0.1, budgets))
    assert row.verdict.value == "unchanged" and "below the floor (6.0%)" in row.note
    # serpentine rounds of one run keep the plain class and the medians' ratio
    row = _row(compare_records([_turns(TURNS_CLEAN, order="serpentine")], [_turns(TURNS_NULL, "x", "serpentine")]))
    assert row.noise_class == plain and row.round_ratio is None
    # and the frame the store caches carries the order to compare
    for fault, meds in ((None, TURNS_CLEAN), ("slow-verify-0us", TURNS_NULL)):
        r = _turns(meds, fault)
        append_record(results_path(tmp_path, "m", "0.5.17", r.suite, fault, True), r)
    row = _row(compare_specs("suite=smoke", "suite=smoke,fault=slow-verify-0us", tmp_path, threshold=0.02))
    assert row.noise_class.endswith(PAIRED_SUFFIX) and row.ratio == pytest.approx(gm)


def test_welch_on_two_flat_sides_is_decided_without_scipy(recwarn):
    """Equal engine medians on both sides (``peak_token_usage`` at batch 16 repeats 0.05078125 on every
    engine of the tiny timing records) have no variance: scipy would warn of precision loss and
    return nan."""
    assert welch_p((0.05078125,) * 3, (0.05078125,) * 3) == 1.0
    assert welch_p((0.05,) * 3, (0.06,) * 3) == 0.0
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]


def test_welch_with_one_flat_side_equals_scipys_p_without_its_warning(recwarn):
    """One side at one value on every engine (a count such as 793 steps on three engines) against a
    side that moved: Welch's t is then the other side's one-sample t, n - 1 degrees of freedom."""
    from scipy.stats import ttest_ind

    flat, moved = (793.0, 793.0, 793.0), (859.0, 800.0, 790.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = float(ttest_ind(flat, moved, equal_var=False).pvalue)
    recwarn.clear()
    assert welch_p(flat, moved) == pytest.approx(expected, rel=1e-9) == welch_p(moved, flat)
    assert 0.3 < expected < 0.5
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]


def test_the_serpentine_order_cancels_a_steady_drift_of_the_host():
    """A host whose speed grows steadily moves every later slot up: in a fixed ``A B A B`` order that
    reads as B faster than A every round; reversed every other round it cancels over each two."""
    from specwatch.run.engine_starts import round_order

    when: dict[str, list[int]] = {"A": [], "B": []}
    t = 0
    for k in range(4):
        for slot in round_order(k, ["A", "B"]):
            when[slot].append(t)
            t += 1
    assert sum(b - a for a, b in zip(when["A"], when["B"])) == 0
    assert round_order(2, ["A", "B", "C"]) == ["A", "B", "C"] and round_order(3, ["A", "B", "C"]) == ["C", "B", "A"]
