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
Records land only after the last start, so a run stopped in between leaves the case unrecorded and
``--resume`` runs all N starts again.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import replace
from typing import Callable, Optional

from specwatch.core.record import CaseRecord, Metric, Status
from specwatch.rules.case_totals import AGREE_CHECK


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


def merge_records(recs: list[CaseRecord], planned: int) -> CaseRecord:
    """The case's one record over its ok engine starts (``recs``, in start order)."""
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
            }
            for r in recs
        ],
    }
    out.provenance = out.provenance.model_copy(update={"finished_at": recs[-1].provenance.finished_at})
    return out


class EngineStarts:
    """Holds one group's ok records start by start; passes the others on at once."""

    def __init__(self, emit: Callable[[CaseRecord], None], planned: int):
        self.emit, self.planned = emit, planned
        self.held: dict[str, list[CaseRecord]] = {}
        self.final: set[str] = set()
        """Cases already recorded (not ok on some start): no later start runs them."""

    def start_emit(self, index: int) -> Callable[[CaseRecord], None]:
        """The ``emit`` of engine start ``index`` (0-based)."""

        def emit(rec: CaseRecord) -> None:
            if rec.status is Status.ok:
                self.held.setdefault(rec.case_id, []).append(rec)
                return
            self.held.pop(rec.case_id, None)
            self.final.add(rec.case_id)
            rec.details["engine_starts"] = {"planned": self.planned, "ran": index + 1, "not_ok_on": index + 1}
            self.emit(rec)

        return emit

    def flush(self, order: list[str]) -> None:
        """Append each held case's merged record, in ``order``."""
        for cid in order:
            if cid in self.held and cid not in self.final:
                self.emit(merge_records(self.held.pop(cid), self.planned))


def run_engine_starts(
    job, starts: int, run_once: Callable[[object], None], after_start: Optional[Callable[[int], None]] = None
) -> None:
    """Run ``job`` (a ``GroupJob``) ``starts`` times through ``run_once``, each time on the cases
    no start has recorded yet, then append the merged records. ``after_start``: called with each
    start's index after it (``run.baseline`` runs a baseline there)."""
    run_engine_rounds([job], starts, run_once, after_start)


def run_engine_rounds(
    jobs: list, starts: int, run_once: Callable[[object], None], after_start: Optional[Callable[[int], None]] = None
) -> None:
    """``run_engine_starts`` over several jobs of one engine group, start by start: round ``k`` runs
    each job's start ``k`` in list order (``A0 B0 A1 B1 ...``), so each job's records merge only its
    own starts (``run.interleave``: one job per fault)."""
    boards = [EngineStarts(job.emit, starts) for job in jobs]
    for k in range(starts):
        ran = False
        for job, es in zip(jobs, boards):
            pending = [c for c in job.cases if c.case_id not in es.final]
            if pending:
                run_once(replace(job, cases=pending, emit=es.start_emit(k)))
                ran = True
        if not ran:
            break
        if after_start is not None:
            after_start(k)
    for job, es in zip(jobs, boards):
        es.flush([c.case_id for c in job.cases])
