"""The release verdict the dashboard opens with (analysis.verdict)."""

import json

from records import case, record
from specwatch.analysis.verdict import release_verdict
from specwatch.core.record import Metric, Status
from specwatch.store.jsonl import append_record, results_path


def _store(root, version, recs):
    for r in recs:
        append_record(results_path(root, "m", version, r.suite), r)


def _two_releases(root):
    """0.5.16 and 0.5.17 of smoke: one exact regression, one improvement, one new failure, one failing check."""
    a, b, c = case(page_size=1), case(page_size=16), case(page_size=64)
    base = [record(x, sglang_version="0.5.16") for x in (a, b, c)]
    head = [
        record(a, sglang_version="0.5.17"),
        record(b, sglang_version="0.5.17"),
        record(c, status=Status.crashed, reason="boom", sglang_version="0.5.17"),
    ]
    for r, accept in zip(base[:2] + head[:2], (4.0, 3.0, 3.5, 3.5)):
        r.metrics["accept_length"] = Metric(value=accept, unit="tokens/verify", exact=True, higher_is_better=True)
    head[0].checks["lossless"] = False
    _store(root, "0.5.16", base)
    _store(root, "0.5.17", head)


def test_verdict_counts_regressions_improvements_new_failures_and_failing_checks(tmp_path):
    _two_releases(tmp_path)
    v = release_verdict(tmp_path)
    assert (v.head_version, v.base_version, v.budgets) == ("0.5.17", "0.5.16", None)
    assert [c.suite for c in v.compared] == ["smoke"]
    assert (v.regressions, v.improvements, v.new_failures, v.failing_checks) == (1, 1, 1, 1)
    assert not v.passed
    assert v.compared[0].now_failing[0].endswith("crashed: boom")
    (health,) = v.health
    assert health.statuses == {"ok": 2, "skipped": 0, "failed": 0, "crashed": 1, "timeout": 0}
    assert health.failing_checks == {"lossless": 1} and not health.healthy


def test_verdict_uses_the_noise_budgets_beside_the_results(tmp_path):
    _two_releases(tmp_path)
    (tmp_path / "noise-budgets.json").write_text(json.dumps({"budgets": {"tiny/bs1": 0.5}}))
    assert release_verdict(tmp_path).budgets == str(tmp_path / "noise-budgets.json")


def test_a_store_with_one_release_has_health_and_nothing_to_compare(tmp_path):
    _store(tmp_path, "0.5.17", [record(case(), sglang_version="0.5.17")])
    v = release_verdict(tmp_path)
    assert v.base_version is None and v.compared == [] and v.passed
    assert v.health[0].healthy
    assert release_verdict(tmp_path / "empty") is None


def test_health_counts_the_cases_of_overlapped_runs(tmp_path):
    """A run with --overlap-starts contends only timing: its statuses are the case's latest."""
    ok = record(case(page_size=1), sglang_version="0.5.17")
    ok.details["overlap_starts"] = True
    _store(
        tmp_path,
        "0.5.17",
        [ok, record(case(page_size=16), status=Status.crashed, reason="boom", sglang_version="0.5.17")],
    )
    (health,) = release_verdict(tmp_path).health
    assert health.statuses["ok"] == 1 and health.statuses["crashed"] == 1


def test_a_release_run_only_with_overlapped_starts_is_compared_on_those_runs(tmp_path):
    """compare's default selection leaves overlapped runs out; a release with no other run must
    not read as 'no change' from an empty side."""
    a = case(page_size=1)
    base, head = record(a, sglang_version="0.5.16"), record(a, sglang_version="0.5.17")
    base.metrics["accept_length"] = Metric(value=4.0, unit="tokens/verify", exact=True, higher_is_better=True)
    head.metrics["accept_length"] = Metric(value=3.0, unit="tokens/verify", exact=True, higher_is_better=True)
    head.details["overlap_starts"] = True
    _store(tmp_path, "0.5.16", [base])
    _store(tmp_path, "0.5.17", [head])
    v = release_verdict(tmp_path)
    assert v.regressions == 1 and v.compared[0].head.endswith(",overlap=on")
