import os

from conftest import SUITES, harness_suite, own_tmpdir_env
from specwatch.core.record import Status
from specwatch.run.runner import RunOptions, Shard, engine_groups, run_suite
from specwatch.store.jsonl import read_records
from specwatch.suite import load_suite

HERE = os.path.dirname(__file__)


def _suite(tmp_path, topks="[1, 2]", extra="", timeout_s=10):
    return harness_suite(tmp_path, topks=topks, extra=extra, timeout_s=timeout_s)


def _run(tmp_path, suite, **kw):
    starts = tmp_path / "starts"
    env = {"PYTHONPATH": HERE + os.pathsep + os.environ.get("PYTHONPATH", ""), "FAKE_WORKER_STARTS": str(starts)}
    out = run_suite(suite, tmp_path / "results", RunOptions(gpus=1, worker_module="fake_worker", extra_env=env, **kw))
    return out, (starts.read_text().count("start") if starts.exists() else 0)


def test_engine_groups_share_an_engine_across_batch_sizes():
    plan = load_suite(SUITES / "tree-page.toml").plan()
    groups = engine_groups(p.case for p in plan)
    assert len(groups) == len(plan) // 2  # batch sizes 1 and 8 share one engine
    assert all({c.batch_size for c in g} == {1, 8} for g in groups)


def test_crash_is_recorded_and_sweep_continues(tmp_path):
    suite = _suite(tmp_path, topks="[1, 4]")
    out, starts = _run(tmp_path, suite)
    recs = list(read_records(out))
    by = {(r.case.page_size, r.case.topk, r.case.batch_size): r for r in recs}
    assert len(recs) == 8
    crashed = [r for r in recs if r.status is Status.crashed]
    assert len(crashed) == 4 and all(r.case.topk == 4 for r in crashed)
    assert "exited with code -9" in crashed[0].reason and "scheduler died" in crashed[0].log_tail
    assert by[(64, 1, 8)].status is Status.ok and by[(64, 1, 8)].metrics["output_throughput"].value == 6400
    assert by[(1, 1, 1)].provenance.suite_sha256 == suite.sha256
    # two chain groups, two tree groups; each crash costs a fresh worker for the rest of its group
    assert starts == 2 + 2 * 2


def test_crash_at_engine_start_fails_the_group_once(tmp_path):
    suite = _suite(tmp_path, topks="[1]", extra="num_steps = [5]")
    out, starts = _run(tmp_path, suite)
    recs = list(read_records(out))
    assert len(recs) == 4 and all(r.status is Status.crashed for r in recs)
    assert recs[0].reason.startswith("engine start: worker exited with code -3")
    assert starts == 2  # one start per group, not one per case


def test_resume_reruns_only_unfinished(tmp_path):
    suite = _suite(tmp_path, topks="[1, 4]")
    out, _ = _run(tmp_path, suite)
    (tmp_path / "starts").unlink()
    out2, starts = _run(tmp_path, suite, resume=True)
    assert out2 == out
    recs = list(read_records(out))
    assert len(recs) == 12  # the 4 crashed cases ran (and crashed) again
    assert starts == 2 * 2  # chain groups were not restarted


def test_known_results_leave_their_cases_out_whatever_their_status(tmp_path):
    suite = _suite(tmp_path, topks="[1, 4]")
    first, _ = _run(tmp_path, suite)  # 4 ok, 4 crashed, in tmp_path/results
    (tmp_path / "starts").unlink()
    starts = tmp_path / "starts"
    env = {"PYTHONPATH": HERE + os.pathsep + os.environ.get("PYTHONPATH", ""), "FAKE_WORKER_STARTS": str(starts)}
    again = run_suite(
        suite,
        tmp_path / "device",
        RunOptions(gpus=1, worker_module="fake_worker", extra_env=env, known_root=tmp_path / "results"),
    )
    assert not starts.exists() and not again.exists()  # nothing started, nothing recorded
    more = _suite(tmp_path, topks="[1, 2, 4]")  # a new topk: only its cases run
    again = run_suite(
        more,
        tmp_path / "device",
        RunOptions(gpus=1, worker_module="fake_worker", extra_env=env, known_root=tmp_path / "results"),
    )
    assert {r.case.topk for r in read_records(again)} == {2}


def test_timeout_is_recorded_and_finished_cases_land_while_the_worker_runs(tmp_path):
    import time

    from specwatch.run.group import _ACTIVE_WORKERS

    suite = _suite(tmp_path, topks="[8]", timeout_s=900)  # --group-timeout 6 overrides the suite's 900 s
    arrivals, running = {}, {}

    def progress(r):
        arrivals.setdefault((r.case.batch_size, r.status), time.monotonic() - t0)
        running.setdefault(r.case.batch_size, set(_ACTIVE_WORKERS))  # the workers not yet ended

    t0 = time.monotonic()
    out, _ = _run(tmp_path, suite, max_groups=1, group_timeout_s=6, progress=progress)
    recs = {r.case.batch_size: r for r in read_records(out)}
    assert recs[1].status is Status.ok
    assert recs[8].status is Status.timeout and "past 6 s" in recs[8].reason
    assert running[1] and not running[8]  # batch 1 landed while its worker ran on (hung in batch 8)
    assert arrivals[(1, Status.ok)] < 6 <= arrivals[(8, Status.timeout)]  # before the kill at 6 s


def test_a_device_side_assertion_is_named_as_the_cause(tmp_path):
    # seen on 2xH200: flashinfer + DCP near full asserted in store_kvcache; Python then raised a cuBLAS error
    out, _ = _run(tmp_path, _suite(tmp_path, topks="[6]"), max_groups=1)
    crashed = [r for r in read_records(out) if r.status is Status.crashed]
    assert crashed and crashed[0].reason.startswith(
        "worker exited with code -9 before finishing this case: device-side assertion in kvcache.cuh:209 "
        "store_kvcache: `index >= 0 && index < size_limit` failed (3 lines of it in the log)"
    )
    assert "surfaced as: RuntimeError: CUDA error: CUBLAS_STATUS_EXECUTION_FAILED" in crashed[0].reason
    # the engine's pool checks, read at its start, stay on the crash record (a crash keeps the why)
    assert crashed[0].checks == {"target_pool_covers_allocator": False}
    assert crashed[0].metrics["target_pool_missing_rows"].value == 64
    assert crashed[0].details["pool_coverage_at_start"]["target"]["missing_rows"] == 64


def test_a_timeout_after_sglang_failed_says_so():
    from specwatch.rules.crashlog import timeout_reason

    assert timeout_reason(9, "Capturing batches\n") == "engine group ran past 9 s"
    failed = "[TP0] Scheduler hit an exception: Traceback (most recent call last):\nValueError: boom\n"
    assert timeout_reason(9, failed) == "engine group ran past 9 s; before that the log shows: ValueError: boom"


def test_a_run_stopped_by_sigterm_still_leaves_its_summary(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    from specwatch.store.jsonl import RUNS_FILE, read_runs

    _suite(tmp_path, topks="[8]", timeout_s=900)  # batch 1 finishes, batch 8 hangs
    script = f"""
import os, sys
sys.path.insert(0, {HERE!r})
from specwatch.run.runner import RunOptions, run_suite
from specwatch.suite import load_suite
run_suite(load_suite({str(tmp_path / "s.toml")!r}), {str(tmp_path / "results")!r}, RunOptions(gpus=1,
          worker_module="fake_worker", max_groups=1,
          extra_env={{"PYTHONPATH": {HERE!r} + os.pathsep + os.environ.get("PYTHONPATH", "")}}))
"""
    proc = subprocess.Popen([sys.executable, "-c", script], env=own_tmpdir_env(tmp_path))
    deadline = time.monotonic() + 60
    results = list((tmp_path / "results").rglob("harness.jsonl"))
    while not (results and results[0].read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.2)
        results = list((tmp_path / "results").rglob("harness.jsonl"))
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    (run,) = read_runs(results[0].parent / RUNS_FILE)
    assert run.stopped_by == "SIGTERM" and run.stopped_early
    assert run.records == {"ok": 1} and run.engine_groups == 1
    # the killed worker's folder (spec, log, results) goes too: the handler's exit ends no `with`
    assert list((tmp_path / "tmp").iterdir()) == []


def test_a_sigterm_while_a_record_is_written_still_counts_it_in_the_summary(tmp_path):
    """The signal lands as the store's append returns, before the run's tally has the record: the
    summary must still agree with the store."""
    import signal
    import subprocess
    import sys

    from specwatch.store.jsonl import RUNS_FILE, read_records, read_runs

    _suite(tmp_path, topks="[8]", timeout_s=900)  # batch 1 finishes, batch 8 hangs
    script = f"""
import os, signal, sys
sys.path.insert(0, {HERE!r})
import specwatch.run.runner as runner
from specwatch.suite import load_suite
append = runner.append_record
def append_then_sigterm(path, rec):
    append(path, rec)
    os.kill(os.getpid(), signal.SIGTERM)
runner.append_record = append_then_sigterm
runner.run_suite(load_suite({str(tmp_path / "s.toml")!r}), {str(tmp_path / "results")!r}, runner.RunOptions(gpus=1,
                 worker_module="fake_worker", max_groups=1,
                 extra_env={{"PYTHONPATH": {HERE!r} + os.pathsep + os.environ.get("PYTHONPATH", "")}}))
"""
    proc = subprocess.run([sys.executable, "-c", script], timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM
    (results,) = (tmp_path / "results").rglob("harness.jsonl")
    assert [r.status.value for r in read_records(results)] == ["ok"]
    (run,) = read_runs(results.parent / RUNS_FILE)
    assert run.stopped_by == "SIGTERM" and run.records == {"ok": 1}


def test_cases_wider_than_the_host_are_recorded_skipped(tmp_path):
    from conftest import SUITES

    out, starts = _run(tmp_path, load_suite(SUITES / "dcp-large.toml"), where={"tp": ["8"]})
    recs = list(read_records(out))
    assert starts == 0 and len(recs) == 20 and all(r.status is Status.skipped for r in recs)
    assert recs[0].reason == "host: needs 8 GPUs, this host has 1"


def test_skips_are_recorded_with_reasons(tmp_path):
    suite = _suite(tmp_path, topks="[2]", extra="tp = [2]\ndcp = [3]\n")
    out, starts = _run(tmp_path, suite)
    recs = list(read_records(out))
    assert starts == 0 and all(r.status is Status.skipped for r in recs)
    assert "must divide" in recs[0].reason


def test_shard_parse():
    assert Shard.parse("2/3") == Shard(2, 3)
    for bad in ("0/3", "4/3", "x"):
        try:
            Shard.parse(bad)
        except ValueError:
            continue
        raise AssertionError(bad)


def test_where_selects_cases(tmp_path):
    suite = _suite(tmp_path)
    out, starts = _run(tmp_path, suite, where={"page_size": {"64"}, "topk": {"1"}})
    recs = list(read_records(out))
    assert [(r.case.page_size, r.case.topk) for r in recs] == [(64, 1), (64, 1)] and starts == 1


def _timed_run(tmp_path, **kw):
    """4 fake groups of 2 cases (starts 0.6 s, 0.2 s of timing per case), all ok, one start each;
    returns the results file and the start and timing intervals (the latter in time order)."""
    import json

    suite = _suite(tmp_path, topks="[1, 2]")
    intervals = tmp_path / "intervals"
    os.environ.update(FAKE_WORKER_INTERVALS=str(intervals), FAKE_START_S="0.6", FAKE_TIME_S="0.2")
    try:
        out, starts = _run(tmp_path, suite, **kw)
    finally:
        for k in ("FAKE_WORKER_INTERVALS", "FAKE_START_S", "FAKE_TIME_S"):
            os.environ.pop(k)
    recs = list(read_records(out))
    assert len(recs) == 8 and all(r.status is Status.ok for r in recs) and starts == 4
    spans = [json.loads(x) for x in intervals.read_text().splitlines()]
    return (
        out,
        [s for s in spans if s["kind"] == "start"],
        sorted((s for s in spans if s["kind"] == "timing"), key=lambda s: s["t0"]),
    )


def test_parallel_starts_overlap_each_other_but_never_a_timed_batch(tmp_path):
    """4 groups in one wave: the fake engine starts (0.6 s each) run together, the timed parts
    (0.2 s per case) run one at a time and only after every start of the wave has ended."""
    out, st, tm = _timed_run(tmp_path, parallel_starts=4)
    assert len(st) == 4 and len(tm) == 4
    assert max(s["t0"] for s in st) < min(s["t1"] for s in st)  # the starts overlapped
    assert min(t["t0"] for t in tm) >= max(s["t1"] for s in st)  # no timing before all starts ended
    assert all(a["t1"] <= b["t0"] for a, b in zip(tm, tm[1:]))  # timed parts one at a time
    # cheaper than starting one by one, read from the workers' own clocks (the wall time of the
    # whole run also holds interpreter starts, which a loaded host stretches)
    span = max(s["t1"] for s in st) - min(s["t0"] for s in st)
    assert span < 0.75 * sum(s["t1"] - s["t0"] for s in st)


def test_overlapping_starts_keep_k_groups_in_flight_and_timed_parts_apart(tmp_path):
    """--overlap-starts, K = 2, 4 groups: a group starts as soon as one ends, so later starts (0.6 s)
    run while earlier groups time (0.2 s per case); timed parts still one at a time; never more than
    2 groups in flight; the run summary says so."""
    from specwatch.store.jsonl import RUNS_FILE, read_runs

    out, st, tm = _timed_run(tmp_path, parallel_starts=2, overlap_starts=True)
    assert all(a["t1"] <= b["t0"] for a, b in zip(tm, tm[1:]))  # timed parts one at a time
    assert any(s["t0"] < t["t1"] and t["t0"] < s["t1"] for s in st for t in tm)  # a start overlapped a timing
    group = {s["pid"]: [s["t0"], s["t0"]] for s in st}
    for t in tm:
        group[t["pid"]][1] = t["t1"]
    edges = sorted([(a, 1) for a, _ in group.values()] + [(b, -1) for _, b in group.values()])
    in_flight = [sum(d for _, d in edges[: i + 1]) for i in range(len(edges))]
    assert max(in_flight) == 2
    (run,) = read_runs(out.parent / RUNS_FILE)
    assert run.overlap_starts and run.parallel_starts == 2 and run.engine_groups == 4
    import pytest

    with pytest.raises(ValueError, match="--parallel-starts K with K > 1"):
        _run(tmp_path, _suite(tmp_path, topks="[1]"), overlap_starts=True)


def test_runs_that_share_a_timing_lock_never_time_at_once(tmp_path):
    """Two --overlap-starts runs on one host (say, two installed SGLang versions) given one
    --timing-lock: their timed parts interleave but never overlap; their summaries say the lock was
    shared. Without --overlap-starts the option is refused."""
    import json
    import threading

    import pytest

    from specwatch.store.jsonl import RUNS_FILE, read_runs

    intervals, lock = tmp_path / "intervals", tmp_path / "shared.lock"
    os.environ.update(FAKE_WORKER_INTERVALS=str(intervals), FAKE_START_S="0.3", FAKE_TIME_S="0.2")
    outs = {}
    try:

        def one(name):
            root = tmp_path / name
            root.mkdir()
            outs[name] = _run(
                root, _suite(root, topks="[1, 2]"), parallel_starts=2, overlap_starts=True, timing_lock=lock
            )[0]

        threads = [threading.Thread(target=one, args=(n,)) for n in ("a", "b")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        for k in ("FAKE_WORKER_INTERVALS", "FAKE_START_S", "FAKE_TIME_S"):
            os.environ.pop(k)
    spans = [json.loads(x) for x in intervals.read_text().splitlines()]
    tm = sorted((x for x in spans if x["kind"] == "timing"), key=lambda x: x["t0"])
    assert len(tm) == 8 and all(a["t1"] <= b["t0"] for a, b in zip(tm, tm[1:]))  # a span per group
    for out in outs.values():
        (run,) = read_runs(out.parent / RUNS_FILE)
        assert run.timing_lock_shared and run.records == {"ok": 8}
    with pytest.raises(ValueError, match="--timing-lock"):
        _run(tmp_path, _suite(tmp_path, topks="[1]"), parallel_starts=2, timing_lock=lock)


def test_parallel_starts_survive_a_worker_dying_before_its_engine_is_up(tmp_path):
    suite = _suite(tmp_path, topks="[1]", extra="num_steps = [3, 5]")
    out, starts = _run(tmp_path, suite, parallel_starts=3)
    recs = list(read_records(out))
    assert len(recs) == 8
    assert {r.status for r in recs if r.case.num_steps == 5} == {Status.crashed}
    assert {r.status for r in recs if r.case.num_steps == 3} == {Status.ok}


def test_every_run_leaves_a_summary_of_its_cost(tmp_path):
    from specwatch.store.jsonl import RUNS_FILE, read_runs

    suite = _suite(tmp_path, topks="[1, 4]")
    out, starts = _run(tmp_path, suite, parallel_starts=2)
    (run,) = read_runs(out.parent / RUNS_FILE)
    assert run.suites == ["harness"] and run.faults == [None] and run.parallel_starts == 2
    assert run.engine_groups == 4 and run.worker_starts == starts == 6  # 2 topk-4 groups crash once more
    assert run.records == {"ok": 4, "crashed": 4} and not run.stopped_early
    assert run.wall_s > 0 and run.case_s >= 0 and run.cost_ratio is None or run.cost_ratio > 0
    assert run.run_id and {r.provenance.run_id for r in read_records(out)} == {run.run_id}
    _run(tmp_path, suite)  # a second run of the same checkout
    ids = [r.provenance.run_id for r in read_records(out)]
    assert len(set(ids)) == 2 and ids.count(run.run_id) == 8


def test_bare_run_turns_the_probe_off_and_files_its_records_apart(tmp_path):
    import pytest

    suite = _suite(tmp_path, topks="[1]")
    probed, _ = _run(tmp_path, suite)
    bare, _ = _run(tmp_path, suite, bare=True)
    assert probed.name == "harness.jsonl" and bare.name == "harness+bare.jsonl"
    recs = list(read_records(bare))
    assert len(recs) == 4 and all(not r.provenance.probe for r in recs)
    assert all(r.details == {"probe_env": "0", "spec_probe": False} for r in recs)
    assert all(r.provenance.probe and r.details["probe_env"] == "1" for r in read_records(probed))
    with pytest.raises(ValueError, match="cannot inject faults"):
        _run(tmp_path, suite, bare=True, faults=("row-widen-revert",))


def test_waves_keep_slow_starters_together():
    from records import case
    from specwatch.core.case import Backend, ModelSize
    from specwatch.run.group import GroupJob
    from specwatch.run.schedule import wave_order

    def job(**kw):
        return GroupJob(suite=None, fault=None, cases=[case(**kw)], emit=print)

    jobs = [
        job(model=ModelSize.llama_8b),
        job(attention_backend=Backend.flashinfer, topk=8, num_draft_tokens=16),
        job(attention_backend=Backend.triton),
        job(attention_backend=Backend.flashinfer, topk=1, num_draft_tokens=4),
        job(attention_backend=Backend.fa3),
        job(tp=2),
    ]
    order = [
        (j.cases[0].model.value, j.cases[0].attention_backend.value, j.cases[0].topk, j.cases[0].tp)
        for j in wave_order(jobs)
    ]
    assert order == [
        ("tiny", "triton", 4, 1),
        ("tiny", "fa3", 4, 1),
        ("tiny", "flashinfer", 1, 1),
        ("tiny", "flashinfer", 8, 1),
        ("tiny", "triton", 4, 2),
        ("8b", "triton", 4, 1),
    ]


def test_rolling_queue_spreads_slow_starters_and_opens_with_one_of_each():
    from records import case
    from specwatch.core.case import Backend
    from specwatch.run.group import GroupJob
    from specwatch.run.schedule import rolling_order

    def job(backend, page):
        topk = 4 if backend is Backend.flashinfer else 1
        return GroupJob(
            suite=None,
            fault=None,
            cases=[case(attention_backend=backend, page_size=page, topk=topk, num_draft_tokens=8)],
            emit=print,
        )

    fast = [job(Backend.triton, p) for p in (1, 16, 64, 256)] + [job(Backend.fa3, p) for p in (1, 16, 64, 256)]
    slow = [job(Backend.flashinfer, p) for p in (1, 64)]
    order = rolling_order(fast + slow)
    assert sorted(map(id, order)) == sorted(map(id, fast + slow))  # nothing lost or repeated
    assert order[0] is slow[0] and order[1] is fast[0]  # one of each, slowest first
    assert order.index(slow[1]) == 5  # then spread: 2 slow in 10
    assert [j for j in order if j in fast] == fast  # suite order within a class


def test_group_clock_does_not_run_while_queued_for_the_timing_lock():
    from specwatch.core.timing_lock import TIMING_EVENT
    from specwatch.run.clock import GroupClock

    now = [0.0]
    clock = GroupClock(100, now=lambda: now[0])
    now[0] = 60
    clock.on_event("engine_started")
    now[0] = 200  # 140 s queued behind other groups' timed batches
    assert clock.elapsed() == 60 and not clock.expired() and clock.queued_s == 140
    clock.on_event(TIMING_EVENT)
    now[0] = 239
    assert clock.elapsed() == 99 and not clock.expired()
    now[0] = 241
    assert clock.expired() and clock.queued_s == 140


def test_a_group_queued_behind_a_wave_is_not_timed_out_for_waiting(tmp_path):
    """Two groups in one wave, each timing 2 cases of 1.5 s: the second queues ~3 s for the timing
    lock, so it spends ~6.3 s in all but ~3.3 s of its own; a 4.5 s group timeout must pass it."""
    suite = _suite(tmp_path, topks="[1]")
    os.environ.update(FAKE_START_S="0.3", FAKE_TIME_S="1.5")
    try:
        out, starts = _run(tmp_path, suite, parallel_starts=2, group_timeout_s=4.5)
    finally:
        for k in ("FAKE_START_S", "FAKE_TIME_S"):
            os.environ.pop(k)
    recs = list(read_records(out))
    assert starts == 2 and len(recs) == 4 and all(r.status is Status.ok for r in recs), [
        (r.status, r.reason) for r in recs
    ]


def test_kit_env_adds_the_folders_a_kits_pth_files_name(tmp_path):
    """A kit's site is on PYTHONPATH, where Python ignores .pth files: 0.5.15's `cutlass` lives behind one."""
    import subprocess
    from pathlib import Path

    site = tmp_path / "site"
    pkg = site / "nvidia_cutlass_dsl" / "python_packages" / "cutlass"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("FOUND = 1\n")
    (site / "nvidia_cutlass_dsl.pth").write_text(
        "# c\nimport os\nnvidia_cutlass_dsl/python_packages"
    )  # no final newline, as shipped
    (site / "env.sh").write_text(f"export PYTHONPATH={site}\n")
    script = Path(__file__).resolve().parents[1] / "scripts" / "kit-env.sh"
    probe = "import cutlass, sys; print(cutlass.FOUND)"
    out = subprocess.run(
        ["bash", "-c", f"source {script} {site} && python3 -c '{probe}'"], capture_output=True, text=True
    )
    assert out.returncode == 0 and out.stdout.strip() == "1", out.stderr
    bare = subprocess.run(
        ["bash", "-c", f"source {site}/env.sh && python3 -c '{probe}'"], capture_output=True, text=True
    )
    assert bare.returncode != 0 and "No module named 'cutlass'" in bare.stderr
