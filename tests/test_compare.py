from records import case, record
from specwatch.analysis.compare import Verdict, compare_records
from specwatch.analysis.compare_report import has_regression, markdown
from specwatch.core.record import Metric, Status


def rec(c, tps_samples, al=4.0, leaked=0.0, status=Status.ok, reason=None, lossless=True):
    r = record(c, status=status, reason=reason)
    if status is Status.ok:
        med = sorted(tps_samples)[len(tps_samples) // 2]
        r.metrics["output_throughput"] = Metric(value=med, unit="tokens/s", samples=tps_samples, higher_is_better=True)
        r.metrics["accept_length"] = Metric(value=al, unit="tokens/verify", exact=True, higher_is_better=True)
        r.metrics["leaked_tokens"] = Metric(value=leaked, unit="tokens", exact=True, higher_is_better=False)
        r.checks["lossless"] = lossless
    return r


A, B, C, D = case(page_size=1), case(page_size=16), case(page_size=64), case(page_size=256)


def verdicts(rows):
    return {(r.case_id, r.metric): r.verdict for r in rows}


def test_noise_is_not_a_regression():
    base = [rec(A, [100, 104, 97])]
    head = [rec(A, [96, 101, 99])]  # -1%: inside threshold
    v = verdicts(compare_records(base, head))
    assert v[(A.case_id, "output_throughput")] is Verdict.unchanged
    spread = [rec(A, [80, 120, 100])]  # -10% median but samples overlap
    v = verdicts(compare_records([rec(A, [110, 90, 111])], spread))
    assert v[(A.case_id, "output_throughput")] is Verdict.unchanged


def test_clear_slowdown_and_exact_changes():
    base = [rec(A, [100, 101, 102]), rec(B, [50, 51, 52]), rec(C, [10, 10, 10])]
    head = [rec(A, [80, 81, 82]), rec(B, [50, 51, 52], al=3.9, leaked=64), rec(C, [10, 10, 10], lossless=False)]
    rows = compare_records(base, head)
    v = verdicts(rows)
    assert v[(A.case_id, "output_throughput")] is Verdict.regressed
    assert v[(B.case_id, "accept_length")] is Verdict.regressed
    assert v[(B.case_id, "leaked_tokens")] is Verdict.regressed
    assert v[(C.case_id, "check:lossless")] is Verdict.regressed
    assert has_regression(rows) and rows[0].verdict is Verdict.regressed
    text = markdown(rows, "0.5.16", "0.5.17")
    assert text.splitlines()[0] == "## specwatch: `0.5.17` vs `0.5.16`" and "| regressed |" in text


def test_a_timed_metric_without_a_direction_moves_but_never_regresses():
    """The oracle's generation time (seconds, no better direction) moved 5% with p=0.078 in a
    paired A/A pair: a change to show, not a regression that fails the comparison."""
    base, head = rec(A, [100, 101, 102]), rec(A, [100, 101, 102])
    base.metrics["model_generation_time"] = Metric(value=1.0, unit="s", samples=[1.0, 1.01, 0.99])
    head.metrics["model_generation_time"] = Metric(value=1.3, unit="s", samples=[1.3, 1.31, 1.29])
    rows = compare_records([base], [head])
    row = next(r for r in rows if r.metric == "model_generation_time")
    assert row.verdict is Verdict.changed and "no better direction" in row.note
    assert not has_regression(rows)


def test_improvement_status_and_membership():
    base = [rec(A, [100, 101, 102]), rec(B, [1, 1, 1]), rec(C, [1, 1, 1], status=Status.crashed, reason="x")]
    head = [rec(A, [130, 131, 133]), rec(C, [1, 1, 1]), rec(D, [1, 1, 1], status=Status.crashed, reason="SIGSEGV")]
    rows = compare_records(base, head)
    v = verdicts(rows)
    assert v[(A.case_id, "output_throughput")] is Verdict.improved
    assert v[(B.case_id, "status")] is Verdict.gone
    assert v[(C.case_id, "status")] is Verdict.now_fixed
    assert v[(D.case_id, "status")] is Verdict.new
    assert not has_regression(rows)
    # a head-only ok case (the sweep grew) is folded out of the way; a head-only crash is not
    text = markdown(compare_records(base, head + [rec(case(page_size=32), [1, 1, 1])]), "b", "h")
    main, folded = text.split("<details>")
    assert f"`{D.case_id}`" in main and "| new |" in main and "SIGSEGV" not in main and "crashed" in main
    assert (
        "1 case(s) only in head, healthy; 3 metric(s) the base did not record" in folded
        and f"`{case(page_size=32).case_id}`" in folded
    )
    assert f"`{case(page_size=32).case_id}`" not in main
    failing = compare_records([rec(A, [1, 1, 1])], [rec(A, [1, 1, 1], status=Status.crashed, reason="boom")])
    assert failing[0].verdict is Verdict.now_failing and has_regression(failing)


def test_aa_noise_report_and_budgets_silence_between_run_noise():
    """Two runs of the same version whose repeats are tight but whose levels differ by 30% (as tiny
    bs1 runs do between sessions): compare flags it; the A/A budget for that class absorbs it, and a
    change beyond the budget is still a regression."""
    from specwatch.analysis.compare import noise_class
    from specwatch.analysis.noise import noise_report

    run1 = [rec(A, [100, 101, 99]), rec(B, [200, 201, 199])]
    run2 = [rec(A, [70, 71, 69]), rec(B, [199, 200, 202])]
    rep = noise_report(compare_records(run1, run2))
    assert (rep.timed, rep.flagged) == (2, 1) and rep.false_positive_rate == 0.5
    key = f"{noise_class(A)}/output_throughput"
    assert abs(rep.spread[key] - 0.30) < 1e-9
    budgets = rep.budgets(margin=1.5)
    assert abs(budgets[key] - 0.45) < 1e-9
    assert not has_regression(compare_records(run1, run2, budgets=budgets))
    worse = [rec(A, [40, 41, 39]), rec(B, [200, 201, 199])]  # -60%: beyond the budget
    assert has_regression(compare_records(run1, worse, budgets=budgets))
    # budgets from A/A pairs that never measured this class leave it at the threshold, and the note says so
    other = {"8b/bs8/output_throughput": 0.1}
    moved = [
        r
        for r in compare_records(run1, [rec(A, [100, 101, 99]), rec(B, [150, 151, 149])], budgets=other)
        if r.verdict is Verdict.regressed
    ]
    assert [r.case_id for r in moved] == [B.case_id]
    assert f"no noise budget for {noise_class(B)}/output_throughput: 5% threshold" in moved[0].note


def test_selection_holds_clean_probed_runs_unless_it_names_fault_or_probe(tmp_path):
    from datetime import timedelta

    from records import T0, prov
    from specwatch.store.jsonl import append_record, results_path
    from specwatch.store.select import select

    clean, faulty, bare = rec(A, [100, 101, 99]), rec(A, [50, 51, 49]), rec(A, [103, 104, 102])
    overlapped = rec(A, [80, 120, 95])  # --overlap-starts: timed while other engines started
    faulty.provenance = prov(fault="accept-off-by-one", started_at=T0 + timedelta(hours=1))
    bare.provenance = prov(probe=False, started_at=T0 + timedelta(hours=2))
    overlapped.provenance = prov(started_at=T0 + timedelta(hours=3))
    overlapped.details["overlap_starts"] = True
    for r in (clean, faulty, bare, overlapped):
        append_record(results_path(tmp_path, "m", "0.5.17", r.suite, r.provenance.fault, r.provenance.probe), r)
    assert select("sglang_version=0.5.17", tmp_path) == [clean]
    assert select("sglang_version=0.5.17,fault=accept-off-by-one", tmp_path) == [faulty]
    assert select("sglang_version=0.5.17,probe=off", tmp_path) == [bare]
    assert select("sglang_version=0.5.17,overlap=on", tmp_path) == [overlapped]
    assert len(select("sglang_version=0.5.17,fault!=x,probe!=x,overlap!=x", tmp_path)) == 4


def test_a_memory_change_is_explained_by_the_versions_own_sizing():
    base, head = rec(C, [100, 100, 100]), rec(C, [100, 100, 100])
    for r, extra, width in ((base, 12, 8204), (head, 20, 8212)):
        r.metrics["req_to_token_row_width"] = Metric(value=width, unit="tokens", exact=True)
        r.details["sglang_sizing"] = {
            "req_to_token_extra_context_len": extra,
            "req_to_token_row_width": width,
            "alloc_len_per_decode": 16,
        }
    row = {r.metric: r for r in compare_records([base], [head])}["req_to_token_row_width"]
    assert row.verdict is Verdict.changed
    assert "req_to_token_extra_context_len 12→20" in row.note and "alloc_len_per_decode" not in row.note
    head.details["sglang_sizing"] = dict(base.details["sglang_sizing"])
    row = {r.metric: r for r in compare_records([base], [head])}["req_to_token_row_width"]
    assert "unchanged: look elsewhere" in row.note


def test_aa_differences_name_the_conditions_that_differ():
    from specwatch.analysis.noise import aa_differences

    serial, parallel = rec(A, [100, 100, 100]), rec(A, [100, 100, 100])
    parallel.details["parallel_starts"] = 8
    assert aa_differences([serial], [parallel]) == ["parallel_starts: 1 vs 8"]
    again = rec(A, [100, 100, 100])
    again.details["parallel_starts"] = 8
    assert aa_differences([parallel], [again]) == []
    again.details["overlap_starts"] = True  # timed while other engines started: no A/A
    assert aa_differences([parallel], [again]) == ["overlap_starts: False vs True"]
    del again.details["overlap_starts"]
    again.details["engine_kwargs"], parallel.details["engine_kwargs"] = {"sleep_on_idle": True}, {"page_size": 64}
    assert aa_differences([parallel], [again]) == ["engine arguments differ"]
    # a busy host on one side (load average around each case): named, below a core's worth not
    quiet, busy = rec(A, [100, 100, 100]), rec(A, [100, 100, 100])
    quiet.details["host_load"], busy.details["host_load"] = {"before": 0.4, "after": 0.6}, {"before": 3.0, "after": 4.0}
    assert aa_differences([quiet], [busy]) == ["host load while timing (1-min average, median over cases): 0.5 vs 3.5"]
    busy.details["host_load"] = {"before": 1.2, "after": None}
    assert aa_differences([quiet], [busy]) == [] and aa_differences([quiet], [serial]) == []


def test_runs_are_selected_by_id_or_by_recency(tmp_path):
    """Two runs of one checkout (an A/A pair in one session) differ only in run_id; records from
    before run ids are one run per specwatch commit."""
    from datetime import timedelta

    import pytest

    from records import T0, prov
    from specwatch.core.errors import SpecwatchInputError
    from specwatch.store.jsonl import append_record, results_path
    from specwatch.store.select import select

    old, first, second = rec(A, [90, 91, 89]), rec(A, [100, 101, 99]), rec(A, [103, 104, 102])
    old.provenance = prov(specwatch_commit="abc")
    first.provenance = prov(specwatch_commit="def", run_id="r1", started_at=T0 + timedelta(hours=1))
    second.provenance = prov(specwatch_commit="def", run_id="r2", started_at=T0 + timedelta(hours=2))
    for r in (second, old, first):  # file order is not run order
        append_record(results_path(tmp_path, "m", "0.5.17", r.suite, None, True), r)
    assert select("sglang_version=0.5.17,run=-1", tmp_path) == [second]
    assert select("run=-2,sglang_version=0.5.17", tmp_path) == [first]  # counted after the other terms
    assert select("sglang_version=0.5.17,run=-3", tmp_path) == [old]
    assert select("run=commit:abc", tmp_path) == [old] and select("run=r1", tmp_path) == [first]
    assert select("run!=r2", tmp_path) == [old, first]
    assert select("run=commit:abc|r2", tmp_path) == [second, old] and select("run!=r1|r2", tmp_path) == [old]
    with pytest.raises(SpecwatchInputError, match="holds 3 run"):
        select("run=-4", tmp_path)


def test_mann_whitney_by_rank_pattern_equals_scipy_on_the_samples_themselves():
    """The p-value is computed once per rank pattern: on repeats with ties, exact and asymptotic
    sizes, and NaN, it equals scipy's on the raw samples."""
    import math
    import random

    from scipy.stats import mannwhitneyu

    from specwatch.analysis.rank_test import mann_whitney_p

    rng = random.Random(7)
    cases = [((1.0, 2.0, 3.0), (4.0, 5.0, 6.0)), ((1.0, 1.0, 2.0), (2.0, 3.0, 3.0)), ((5.0,) * 3, (5.0,) * 3)]
    for n, m in ((3, 3), (3, 5), (9, 12)):
        for _ in range(40):
            cases.append(
                (
                    tuple(rng.choice((rng.gauss(100, 5), 100.0)) for _ in range(n)),
                    tuple(rng.gauss(103, 5) for _ in range(m)),
                )
            )
    for b, h in cases:
        want = mannwhitneyu(b, h, alternative="two-sided").pvalue
        got = mann_whitney_p(b, h)
        assert got == want or (math.isnan(got) and math.isnan(want)), (b, h, got, want)
    assert math.isnan(mann_whitney_p((1.0, float("nan"), 2.0), (3.0, 4.0, 5.0)))


def test_the_exact_p_value_is_scipys_bit_for_bit_for_every_u_of_every_size_up_to_8():
    """Without ties the exact p-value depends only on the two sizes and U: every (n1, n2, U) with
    both sides of at most 8 samples gives scipy's p exactly (==), with scipy never imported for it."""
    import itertools

    from scipy.stats import mannwhitneyu

    from specwatch.analysis.rank_test import EXACT_MAX, exact_p

    checked = 0
    for n1, n2 in itertools.product(range(1, EXACT_MAX + 1), repeat=2):
        seen = set()
        for at in itertools.combinations(range(n1 + n2), n1):  # the first side's places among both
            base, head = at, tuple(i for i in range(n1 + n2) if i not in at)
            u1 = sum(x > y for x in base for y in head)
            if u1 not in seen:
                seen.add(u1)
                assert exact_p(base, head) == float(mannwhitneyu(base, head, alternative="two-sided").pvalue)
                checked += 1
        assert len(seen) == n1 * n2 + 1  # every U from 0 to n1 n2
    assert checked == 1360
    assert exact_p((1, 2, 2), (3, 4, 5)) is None  # a tie: scipy's normal approximation
    assert exact_p(tuple(range(9)), tuple(range(9, 18))) is None  # both sides past 8


def test_a_timed_comparison_of_repeats_without_ties_imports_no_scipy():
    import os
    import subprocess
    import sys

    code = (
        "import sys; from specwatch.analysis.rank_test import mann_whitney_p; "
        "p = mann_whitney_p((1.0, 2.0, 3.0), (4.0, 5.0, 6.0)); "
        "assert p == 0.1, p; assert 'scipy.stats' not in sys.modules"
    )
    subprocess.run(
        [sys.executable, "-c", code], check=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    )


def test_a_consistent_change_inside_the_threshold_is_listed_below_the_floor_and_noise_is_not():
    steady = [100.0 + 0.1 * i for i in range(8)]
    slower = [x * 0.97 for x in steady]  # -3%: every repeat below every base repeat, within 5%
    noisy = [x * (0.97 if i % 2 else 1.02) for i, x in enumerate(steady)]  # -3% or +2%: overlapping
    base, head = [rec(A, steady), rec(B, steady)], [rec(A, slower), rec(B, noisy)]
    rows = {(r.case_id, r.metric): r for r in compare_records(base, head)}
    a, b = rows[(A.case_id, "output_throughput")], rows[(B.case_id, "output_throughput")]
    assert a.verdict is Verdict.unchanged and a.below_floor and "below the floor (5.0%)" in a.note
    assert b.verdict is Verdict.unchanged and not b.below_floor
    text = markdown(list(rows.values()), "b", "h")
    assert "1 timed change(s) below the floor" in text and f"`{A.case_id}`" in text and f"`{B.case_id}`" not in text
    # past the threshold the same change is a regression, not a listing
    rows = {(r.case_id, r.metric): r for r in compare_records(base, head, threshold=0.02)}
    a = rows[(A.case_id, "output_throughput")]
    assert a.verdict is Verdict.regressed and not a.below_floor
