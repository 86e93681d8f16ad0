"""A spec case's plain-decoding twin and its speedup over it (Spec-Bench's headline number).

A suite with ``[suite] speedup = true`` plans each timing case's twin (``Case.plain_twin``: the
same target engine and timed batch, no speculation). A spec record then carries two metrics
computed from its twin's record (``twin_metrics``) and the twin's record id (``plain_twin``):

* ``speedup`` = spec ``output_throughput`` / plain ``output_throughput`` (medians; its samples
  are each spec repeat over the plain median, so ``compare`` tests it like any timed metric);
* ``break_even_accept_length`` = spec ``step_time`` / plain ``step_time``: the acceptance length
  (tokens per verify step) at which speculation only matches plain decoding. A spec step (draft +
  verify) costs ``T_s`` and yields ``accept_length`` tokens per request, a plain step costs
  ``T_p`` and yields one, so spec is faster exactly when ``accept_length > T_s / T_p``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Optional

from specwatch.core.record import CaseRecord, Metric, Status
from specwatch.store.latest import latest_key, record_id

SPEEDUP = "speedup"
"""Metric: spec output tokens/s over its plain twin's (unit ``x``, higher is better)."""

BREAK_EVEN = "break_even_accept_length"
"""Metric: spec step time over plain step time, in tokens per verify step (lower is better)."""

THROUGHPUT = "output_throughput"
"""The throughput the speedup is the ratio of (output tokens per second of the timed batch)."""

STEP = "step_time"
"""Milliseconds per decode step (a spec step: draft + verify; a plain step: one token)."""


def twin_metrics(spec: CaseRecord, plain: CaseRecord) -> dict[str, Metric]:
    """``speedup`` and (both records having ``step_time``) ``break_even_accept_length`` of an ok
    spec record over its ok plain twin; empty where either lacks ``output_throughput``."""
    s, p = spec.metrics.get(THROUGHPUT), plain.metrics.get(THROUGHPUT)
    if s is None or p is None or not p.value or p.value != p.value:
        return {}
    samples = [x / p.value for x in s.samples]
    out = {SPEEDUP: Metric(value=s.value / p.value, unit="x", samples=samples, higher_is_better=True)}
    ss, ps = spec.metrics.get(STEP), plain.metrics.get(STEP)
    if ss is not None and ps is not None and ps.value:
        out[BREAK_EVEN] = Metric(value=ss.value / ps.value, unit="tokens/verify", higher_is_better=False)
    return out


def with_speedup(spec: CaseRecord, plain: CaseRecord) -> CaseRecord:
    """``spec`` with ``twin_metrics`` over ``plain`` added and ``plain_twin`` naming it (unchanged
    where there is nothing to compute)."""
    extra = twin_metrics(spec, plain)
    if not extra:
        return spec
    return spec.model_copy(
        update={
            "metrics": {**spec.metrics, **extra},
            "plain_twin": record_id(plain.case_id, plain.provenance.started_at),
        }
    )


def is_twin(rec: CaseRecord) -> bool:
    """Whether the record is a plain-decoding twin (algorithm ``NONE``)."""
    return not rec.case.algorithm.speculative


class TwinBoard:
    """The ok plain twins of one results file, kept as they are recorded, so that each spec record
    gets its speedup when it is recorded after its twin (the suite plans the twin's engine group
    first; under ``--parallel-starts`` a twin may finish later, and that record has none)."""

    def __init__(self, records: Iterable[CaseRecord] = (), off: bool = False):
        self.off = off
        """True: a suite without ``[suite] speedup``; ``add`` returns every record as it is."""
        self.plain: dict[str, CaseRecord] = {}
        """Plain twin case id -> its latest ok record."""
        for r in records:
            self._keep(r)

    @classmethod
    def of_file(cls, path: Path) -> "TwinBoard":
        """A board holding the twins already in ``path`` (a resumed run)."""
        from specwatch.store.jsonl import read_records

        return cls(read_records(path) if Path(path).exists() else ())

    def _keep(self, rec: CaseRecord) -> None:
        if is_twin(rec) and rec.status is Status.ok:
            old = self.plain.get(rec.case_id)
            if old is None or latest_key(rec) >= latest_key(old):
                self.plain[rec.case_id] = rec

    def twin_of(self, rec: CaseRecord) -> Optional[CaseRecord]:
        """The recorded plain twin of a spec record, or None."""
        return self.plain.get(rec.case.plain_twin().case_id)

    def add(self, rec: CaseRecord) -> CaseRecord:
        """The record as it is to be written: a twin is kept; an ok spec record whose twin is known
        gets its speedup (``with_speedup``)."""
        if self.off:
            return rec
        if is_twin(rec):
            self._keep(rec)
            return rec
        twin = self.twin_of(rec) if rec.status is Status.ok else None
        return rec if twin is None else with_speedup(rec, twin)


def with_late_speedups(records: Iterable[CaseRecord]) -> list[CaseRecord]:
    """``records`` with the speedup of every ok spec record that lacks one and whose twin is among
    them (the latest ok twin recorded in the same results file: machine, SGLang version, suite,
    fault, probe), as ``TwinBoard`` would have added had the twin been recorded first (under
    ``--parallel-starts`` a twin may finish after the cases it serves)."""
    records = list(records)
    boards: dict[tuple, TwinBoard] = {}
    for r in records:
        if is_twin(r):
            boards.setdefault(results_place(r), TwinBoard())._keep(r)
    out = []
    for r in records:
        board = boards.get(results_place(r))
        if board is not None and not is_twin(r) and r.status is Status.ok and SPEEDUP not in r.metrics:
            r = board.add(r)
        out.append(r)
    return out


def results_place(rec: CaseRecord) -> tuple:
    """What puts a record in its results file: machine, SGLang version, suite, fault, probe."""
    p = rec.provenance
    return (p.machine, p.sglang_version, rec.suite, p.fault, p.probe)
