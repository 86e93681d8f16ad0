"""Engine starts measured before a run was killed are kept (run.start_journal): --resume adopts
them and times only the starts a case lacks."""

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Callable, Optional

from conftest import own_tmpdir_env
from records import T0, case, record
from specwatch.core.record import Status
from specwatch.run.engine_starts import run_engine_rounds
from specwatch.run.start_journal import StartJournal, journal_path
from specwatch.store.jsonl import append_record, read_records

HERE = os.path.dirname(__file__)
SRC = str(Path(HERE).parent / "src")

RUN = """
import sys
sys.path[:0] = [{here!r}]
from conftest import harness_suite
from specwatch.run.runner import RunOptions, run_suites
from pathlib import Path
tmp = Path({tmp!r})
suite = harness_suite(tmp, topks="[1]", header="engine_starts = 3")
env = {{"PYTHONPATH": {here!r}, "FAKE_ORDER": str(tmp / "order-{resume}"), "FAKE_START_S": "{start_s}"}}
run_suites([suite], tmp / "results", RunOptions(gpus=1, worker_module="fake_worker", extra_env=env, resume={resume}))
"""


def _runner(tmp_path, resume, start_s):
    code = RUN.format(here=HERE, tmp=str(tmp_path), resume=resume, start_s=start_s)
    env = own_tmpdir_env(tmp_path)  # a SIGKILLed runner leaves its worker's folder: keep it there
    env["PYTHONPATH"] = os.pathsep.join([SRC, HERE, os.environ.get("PYTHONPATH", "")])
    return subprocess.Popen([sys.executable, "-c", code], env=env, start_new_session=True)


def test_a_run_killed_between_engine_starts_resumes_from_the_starts_it_measured(tmp_path):
    results = tmp_path / "results"
    proc = _runner(tmp_path, resume=False, start_s=1.0)
    journal = None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # two starts of the first group (two cases each) journaled
        journal = next(results.rglob("*.jsonl.starts"), None) if results.exists() else None
        if journal is not None and len(journal.read_text().splitlines()) >= 4:
            break
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # no stop handler runs: the host went away
    proc.wait()
    assert journal is not None, "no engine start was journaled"
    out = journal.with_name(journal.name[: -len(".starts")])
    assert not out.exists() or not [r for r in read_records(out) if r.status is Status.ok]
    journaled = {r.case_id for r in read_records(journal)}
    assert len(journaled) == 2

    assert _runner(tmp_path, resume=True, start_s=0).wait(timeout=300) == 0
    starts = (tmp_path / "order-True").read_text().splitlines()  # a killed run's worker may still write its own
    recs = {r.case_id: r for r in read_records(out)}
    assert len(recs) == 4 and all(r.status is Status.ok for r in recs.values())
    for cid, r in recs.items():
        es = r.details["engine_starts"]
        assert len(r.metrics["output_throughput"].engine_medians) == 3 == es["ran"]
        adopted = es.get("resumed", 0)
        assert adopted == (2 if cid in journaled else 0)
        assert [e.get("resumed", False) for e in es["engines"]] == [True] * adopted + [False] * (3 - adopted)
    assert len(starts) == 1 + 3  # the first group's last start, then the second group's three


def _at(minutes):
    return T0 + timedelta(minutes=minutes)


def test_only_starts_newer_than_the_cases_last_record_are_adopted(tmp_path):
    out = tmp_path / "s.jsonl"
    a, b = case(batch_size=1), case(batch_size=8)
    j = StartJournal(out)
    for c in (a, b):
        for m in (0, 1):
            j.add(record(c, started_at=_at(m), finished_at=_at(m)))
    append_record(out, record(a, status=Status.crashed, reason="worker died", started_at=_at(2), finished_at=_at(2)))
    j.add(record(a, started_at=_at(3), finished_at=_at(3)))
    j.add(record(a, status=Status.crashed, reason="worker died", started_at=_at(4), finished_at=_at(4)))
    got = j.unmerged([a.case_id, b.case_id])
    assert [r.provenance.started_at for r in got[a.case_id]] == [_at(3)]  # the crash at 2 started it over
    assert [r.provenance.started_at for r in got[b.case_id]] == [_at(0), _at(1)]
    assert journal_path(out).name == "s.jsonl.starts"
    assert StartJournal(tmp_path / "none.jsonl").unmerged([a.case_id]) == {}


@dataclass
class _Job:
    cases: list
    emit: Callable
    results_file: Optional[Path] = None
    resume: bool = False
    on_start: Optional[Callable] = None


def test_interleaved_passes_adopt_only_the_rounds_every_pass_measured(tmp_path):
    c = case()
    files = [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]
    for f, n in zip(files, (2, 1)):  # pass A journaled two rounds, pass B one
        for m in range(n):
            StartJournal(f).add(record(c, tps=10.0 + m, started_at=_at(m), finished_at=_at(m)))
    got = {str(f): [] for f in files}
    jobs = [_Job([c], got[str(f)].append, f, resume=True) for f in files]
    ran = []

    def run_once(job):
        ran.append(job.results_file.name)
        job.emit(record(c, tps=20.0, started_at=_at(9), finished_at=_at(9)))

    run_engine_rounds(jobs, 3, run_once)
    assert ran == ["b.jsonl", "a.jsonl", "a.jsonl", "b.jsonl"]  # rounds 1 and 2 of each pass, serpentine
    for f in files:
        (merged,) = got[str(f)]
        assert merged.metrics["output_throughput"].engine_medians == [10.0, 20.0, 20.0]
        assert merged.details["engine_starts"]["resumed"] == 1
    assert len(list(read_records(journal_path(files[0])))) == 4  # 2 earlier + 2 this run, nothing dropped


def test_without_resume_a_run_times_every_start_and_still_journals_them(tmp_path):
    c = case()
    f = tmp_path / "a.jsonl"
    StartJournal(f).add(record(c, tps=1.0))
    got = []
    calls = []
    run_engine_rounds([_Job([c], got.append, f)], 3, lambda job: (calls.append(1), job.emit(record(c))))
    assert len(calls) == 3 and "resumed" not in got[0].details["engine_starts"]
    assert len(list(read_records(journal_path(f)))) == 4
    assert got[0].metrics["output_throughput"].engine_medians == [100.0] * 3


def test_each_engine_start_is_reported_as_it_ends(tmp_path):
    """A timing run's records land after its last start: its progress is each start as it ends."""
    from conftest import harness_suite
    from specwatch.run.runner import RunOptions, run_suites

    suite = harness_suite(tmp_path, topks="[1]", header="engine_starts = 3")
    seen = []
    env = {"PYTHONPATH": HERE + os.pathsep + os.environ.get("PYTHONPATH", "")}
    opts = RunOptions(
        gpus=1,
        worker_module="fake_worker",
        extra_env=env,
        faults=(None, "slow-verify-0us"),
        start_progress=lambda rec, n, planned: seen.append((rec.case_id, rec.provenance.fault, n, planned)),
    )
    run_suites([suite], tmp_path / "results", opts)
    cases = {cid for cid, _, _, _ in seen}
    assert len(cases) == 4 and len(seen) == 4 * 2 * 3
    for cid in cases:
        for fault in (None, "slow-verify-0us"):
            assert [n for c, f, n, p in seen if c == cid and f == fault and p == 3] == [1, 2, 3]
