"""The records the runner writes for a worker's cases: one it finished (its line plus provenance), one
it did not (dead, timed out, or a line that did not validate), with the worker's log tail."""

from __future__ import annotations

from typing import Optional

from specwatch.core.case import Case
from specwatch.core.protocol import CaseLine, EngineFacts
from specwatch.core.record import CaseRecord, Metric, Status, utcnow
from specwatch.run.provenance import collect
from specwatch.suite import Suite

LOG_TAIL_LINES = 60
"""Lines of the worker's log a failure record keeps."""


MALFORMED = "malformed worker line: "
"""Start of the reason of a case whose worker line did not validate (the error follows)."""


def log_tail(text: str, n: int = LOG_TAIL_LINES) -> str:
    """The last ``n`` lines of a worker's log."""
    return "\n".join(text.splitlines()[-n:])


def record_from_worker(
    suite: Suite, case: Case, line: CaseLine, fault: Optional[str], probe: bool = True
) -> CaseRecord:
    """A worker's per-case line -> CaseRecord with provenance."""
    return CaseRecord(
        suite=suite.name,
        case_id=case.case_id,
        case=case,
        status=line.status,
        reason=line.reason if line.status is not Status.ok else None,
        log_tail=line.log_tail,
        metrics={k: Metric(**m.model_dump()) for k, m in line.metrics.items()},
        checks=line.checks,
        details=line.details,
        provenance=collect(
            line.started_at or utcnow(), line.finished_at or utcnow(), str(suite.path), suite.sha256, fault, probe
        ),
    )


def failure_record(
    suite: Suite,
    case: Case,
    status: Status,
    reason: str,
    log_tail: Optional[str],
    fault: Optional[str],
    started,
    probe: bool = True,
    at_start: Optional[EngineFacts] = None,
) -> CaseRecord:
    """A case the worker did not finish. ``at_start``: the worker's ``engine_facts`` line, whose
    structural pool checks hold for every case of the engine, so the record keeps them."""
    at_start = at_start or EngineFacts()
    return CaseRecord(
        suite=suite.name,
        case_id=case.case_id,
        case=case,
        status=status,
        reason=reason,
        log_tail=log_tail,
        metrics={k: Metric(**m.model_dump()) for k, m in at_start.metrics.items()},
        checks=dict(at_start.checks),
        details=dict(at_start.details),
        provenance=collect(started, utcnow(), str(suite.path), suite.sha256, fault, probe),
    )
