"""Several engine starts per case (the suite's ``engine_starts``): the group N times, one record per case.

At batch 1 most of a case's timing noise is between engines (the same case spread 639-970 tok/s
over three engine starts on an H200, each engine's repeats within ~5%), so one engine's repeats
say little about the next engine's. With ``engine_starts = N`` the runner runs the case's engine
group N times, each time in a fresh worker process with a fresh ``sglang.Engine``, holds each
case's ok records, and after the last start appends one merged record (``merge_records``): every
repeat in ``samples``, each engine's own value in ``Metric.engine_medians``, and the value the
median of those.

A case that is not ok on some start (crashed, timed out, failed, skipped) is recorded then, as one
engine start records it, and its held records are dropped: a crash on any engine is the finding.
Merged records land only after the last start; each start's ok record is journaled as it arrives
(``run.start_journal``), so ``--resume`` after a run stopped in between adopts the starts already
timed and runs only the ones a case lacks.
"""

from __future__ import annotations

import contextlib
import functools
import math
import statistics
import threading
from dataclasses import replace
from typing import Callable, Iterator, Optional

from specwatch.core.record import CaseRecord, Metric, Status
from specwatch.core.turns import SIDE_A, SIDE_B, TurnPipes
from specwatch.rules.case_totals import AGREE_CHECK
from specwatch.run.start_journal import StartJournal


def _median(values: list[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return statistics.median(finite) if finite else math.nan


def merge_metric(ms: list[Metric]) -> tuple[Metric, bool]:
    """One metric over the engine starts that recorded it, and whether an exact one agreed.

    A timed metric's value is the median of the engines' values; an exact one's is the common
    value, or where the engines disagree the worst of them (by ``higher_is_better``; the last one
    without a direction)."""
    values = [m.value for m in ms]
    first = ms[0]
    agree = True
    if first.exact:
        agree = len(set(values)) == 1
        if agree or first.higher_is_better is None:
            value = values[-1]
        else:
            value = min(values) if first.higher_is_better else max(values)
    else:
        value = _median(values)
    merged = Metric(
        value=value,
        unit=first.unit,
        samples=[s for m in ms for s in m.samples],
        expected=first.expected,
        exact=first.exact,
        higher_is_better=first.higher_is_better,
        engine_medians=values,
    )
    return merged, agree


def merge_records(recs: list[CaseRecord], planned: int, adopted: int = 0) -> CaseRecord:
    """The case's one record over its ok engine starts (``recs``, in start order; the first
    ``adopted`` of them taken from the start journal of an earlier, stopped run)."""
    names = list(dict.fromkeys(n for r in recs for n in r.metrics))
    metrics, agree = {}, True
    for name in names:
        metrics[name], ok = merge_metric([r.metrics[name] for r in recs if name in r.metrics])
        agree = agree and ok
    checks: dict[str, bool] = {}
    for r in recs:
        for name, ok in r.checks.items():
            checks[name] = checks.get(name, True) and ok
    checks[AGREE_CHECK] = agree
    out = recs[0].model_copy(deep=True)
    out.metrics, out.checks = metrics, checks
    out.details["engine_starts"] = {
        "planned": planned,
        "ran": len(recs),
        "engines": [
            {
                "started_at": r.provenance.started_at.isoformat(),
                "finished_at": r.provenance.finished_at.isoformat(),
                "output_digest": r.details.output_digest,
                "host_load": r.details.host_load.model_dump() if r.details.host_load else None,
                **({"timed_cpu": r.details.timed_cpu} if r.details.timed_cpu is not None else {}),
                **({"timed_windows": r.details.timed_windows} if r.details.timed_windows is not None else {}),
                **({"sglang_step_distribution": d} if (d := _step_distribution(r)) else {}),
                **({"resumed": True} if i < adopted else {}),
            }
            for i, r in enumerate(recs)
        ],
        **({"resumed": adopted} if adopted else {}),
    }
    out.provenance = out.provenance.model_copy(update={"finished_at": recs[-1].provenance.finished_at})
    return out


def _step_distribution(rec: CaseRecord) -> Optional[dict]:
    """The engine's step-time window distribution (``details.sglang_step_times.distribution_ms``)."""
    return (rec.details.sglang_step_times or {}).get("distribution_ms")


class EngineStarts:
    """Holds one group's ok records start by start (journaling each, where a journal is given);
    passes the others on at once."""

    def __init__(
        self,
        emit: Callable[[CaseRecord], None],
        planned: int,
        journal: Optional[StartJournal] = None,
        adopted: Optional[dict[str, list[CaseRecord]]] = None,
        on_start: Optional[Callable[[CaseRecord, int, int], None]] = None,
    ):
        self.emit, self.planned, self.journal, self.on_start = emit, planned, journal, on_start
        self.held: dict[str, list[CaseRecord]] = {cid: list(recs[:planned]) for cid, recs in (adopted or {}).items()}
        self.adopted: dict[str, int] = {cid: len(recs) for cid, recs in self.held.items()}
        """Per case, how many of its held starts came from the journal (they come first)."""
        self.final: set[str] = set()
        """Cases already recorded (not ok on some start): no later start runs them."""

    def needs(self, case_id: str) -> bool:
        """Whether the case still lacks a start (not recorded, fewer than ``planned`` held)."""
        return case_id not in self.final and len(self.held.get(case_id, ())) < self.planned

    def keep(self, case_id: str, count: int) -> None:
        """Hold at most ``count`` adopted starts of the case (the rounds every interleaved pass has)."""
        if case_id in self.adopted and self.adopted[case_id] > count:
            self.held[case_id] = self.held[case_id][:count]
            self.adopted[case_id] = count

    def start_emit(self) -> Callable[[CaseRecord], None]:
        """The ``emit`` of the next engine start of the cases that still need one."""

        def emit(rec: CaseRecord) -> None:
            if rec.status is Status.ok:
                if self.journal is not None:
                    self.journal.add(rec)
                self.held.setdefault(rec.case_id, []).append(rec)
                if self.on_start is not None:
                    self.on_start(rec, len(self.held[rec.case_id]), self.planned)
                return
            ran = len(self.held.pop(rec.case_id, ())) + 1
            self.final.add(rec.case_id)
            rec.details["engine_starts"] = {"planned": self.planned, "ran": ran, "not_ok_on": ran}
            self.emit(rec)

        return emit

    def flush(self, order: list[str]) -> None:
        """Append each held case's merged record, in ``order``."""
        for cid in order:
            if cid in self.held and cid not in self.final:
                self.emit(merge_records(self.held.pop(cid), self.planned, self.adopted.get(cid, 0)))


def _board(job, starts: int) -> EngineStarts:
    """The ``EngineStarts`` of ``job`` (a ``GroupJob``): journaled where the job names its results
    file, adopting the journal's starts where it resumes."""
    journal = StartJournal(job.results_file) if job.results_file is not None else None
    adopted = journal.unmerged(c.case_id for c in job.cases) if journal and job.resume else None
    return EngineStarts(job.emit, starts, journal, adopted, job.on_start)


def run_engine_starts(
    job, starts: int, run_once: Callable[[object], None], beside: Optional[Callable[[int], None]] = None
) -> None:
    """Run ``job`` (a ``GroupJob``) ``starts`` times through ``run_once``, each time on the cases
    no start has recorded yet, then append the merged records. ``beside``: another run paired with
    each start (``run.baseline`` runs a plain-loop baseline there), called with the start's index,
    in the serpentine order of ``run_engine_rounds``."""
    run_engine_rounds([job], starts, run_once, beside)


def round_order(k: int, slots: list) -> list:
    """Round ``k``'s order of ``slots``: as listed on even rounds, reversed on odd ones (``A0 B0 B1 A1
    A2 B2 ...``). A host that drifts steadily over the run then moves each pair's later slot up in
    one round and down in the next, so the drift cancels over each two rounds instead of reading,
    every round alike, as the difference between the slots (a fixed ``A B A B`` order)."""
    return list(slots) if k % 2 == 0 else list(reversed(slots))


@contextlib.contextmanager
def alongside(work: Callable[[], None], stop: Optional[Callable[[], None]] = None) -> Iterator[None]:
    """Run ``work`` on a thread of its own while the block runs; wait for it at the block's end and
    raise what it raised. ``stop``: called first where the block raised (Ctrl-C), so the wait is short."""
    failed: list[BaseException] = []

    def body() -> None:
        try:
            work()
        except BaseException as e:  # noqa: BLE001 - raised again on the caller's thread
            failed.append(e)

    thread = threading.Thread(target=body, name="specwatch-beside", daemon=True)
    thread.start()
    try:
        yield
    except BaseException:
        if stop is not None:
            stop()
        raise
    finally:
        thread.join()
    if failed:
        raise failed[0]


def run_turns(
    k: int,
    a: Callable[[TurnPipes], None],
    b: Callable[[TurnPipes], None],
    stop: Optional[Callable[[], None]] = None,
) -> None:
    """Round ``k``'s two sides at once, taking turns through the round's pipes (``core.turns``):
    ``a(pipes)`` on this thread, ``b(pipes)`` on one of its own (``alongside``, ``stop``); side ``a``
    takes the first turn on even rounds, ``b`` on odd ones. A side whose work returns counts as
    started, so the other never waits on a process that did not start (it then runs alone)."""
    pipes = TurnPipes(first=round_order(k, [SIDE_A, SIDE_B])[0])

    def side(work: Callable[[TurnPipes], None], name: str) -> Callable[[], None]:
        def run() -> None:
            try:
                work(pipes)
            finally:
                pipes.started(name)

        return run

    try:
        with alongside(side(b, SIDE_B), stop):
            side(a, SIDE_A)()
    finally:
        pipes.close()


def run_pair(jobs: list, k: int, run_once: Callable[[object], None], stop: Optional[Callable[[], None]] = None) -> None:
    """Round ``k``'s starts of two jobs (``GroupJob`` s, None for one with nothing to run) at once,
    their workers taking turns (``run_turns``: the first job's worker takes the first turn on even
    rounds); one job alone runs alone."""

    def start(job, side: str) -> Callable[[TurnPipes], None]:
        return lambda pipes: None if job is None else run_once(replace(job, turns=pipes, turn_side=side))

    run_turns(k, start(jobs[0], SIDE_A), start(jobs[1], SIDE_B), stop)


def _round_starts(jobs: list, boards: list[EngineStarts]) -> list:
    """Each job cut to the cases that still lack a start (None where none does), each emitting
    into its board's next start."""
    out = []
    for job, es in zip(jobs, boards):
        pending = [c for c in job.cases if es.needs(c.case_id)]
        out.append(replace(job, cases=pending, emit=es.start_emit()) if pending else None)
    return out


def _run_with_turns(jobs: list, run_once: Callable[[object], None], pipes: TurnPipes) -> None:
    """``run_once`` each job that is not None, its worker taking turns through ``pipes``."""
    for job in jobs:
        if job is not None:
            run_once(replace(job, turns=pipes))


BESIDE = object()
"""``run_engine_rounds``' slot of the ``beside`` run in a round's order."""


def _rounds_held(jobs: list, boards: list[EngineStarts], starts: int) -> int:
    """The rounds every case still lacking a start already holds (adopted from the journal on
    ``--resume``): the resumed run goes on at that round, in its serpentine order and index."""
    held = [len(es.held.get(c.case_id, ())) for job, es in zip(jobs, boards) for c in job.cases if es.needs(c.case_id)]
    return min(held, default=starts)


def run_engine_rounds(
    jobs: list,
    starts: int,
    run_once: Callable[[object], None],
    beside: Optional[Callable[..., None]] = None,
    stop: Optional[Callable[[], None]] = None,
    paired: bool = False,
) -> None:
    """``run_engine_starts`` over several jobs of one engine group, start by start: round ``k`` runs
    each job's start ``k`` (and ``beside(k)`` after them), in ``round_order`` (``A0 B0 B1 A1 A2 B2
    ...``), so each job's records merge only its own starts (``run.interleave``: one job per fault).
    A resumed run starts at the first round its cases lack (``_rounds_held``). ``paired``: each
    round's two sides at once, taking turns (``run_turns``, ``stop``): the job's start and
    ``beside(k, pipes)`` (``run.baseline``'s paired plain loop), or, without ``beside``, two jobs'
    starts (``run_pair``)."""
    boards = [_board(job, starts) for job in jobs]
    if len(boards) > 1:  # interleaved passes: adopt only the rounds every pass has, so rounds pair
        for cid in {c.case_id for job in jobs for c in job.cases}:
            sharing = [es for job, es in zip(jobs, boards) if any(c.case_id == cid for c in job.cases)]
            common = min(len(es.held.get(cid, ())) for es in sharing)
            for es in sharing:
                es.keep(cid, common)
    for k in range(_rounds_held(jobs, boards, starts), starts):
        if not any(es.needs(c.case_id) for job, es in zip(jobs, boards) for c in job.cases):
            break
        cut = _round_starts(jobs, boards)
        if paired and beside is not None:
            run_turns(k, functools.partial(_run_with_turns, cut, run_once), functools.partial(beside, k), stop)
        elif paired and len(jobs) == 2:
            run_pair(cut, k, run_once, stop)
        else:
            for slot in round_order(k, [*cut, *([BESIDE] if beside is not None else [])]):
                if slot is BESIDE:
                    beside(k)
                elif slot is not None:
                    run_once(slot)
    for job, es in zip(jobs, boards):
        es.flush([c.case_id for c in job.cases])
