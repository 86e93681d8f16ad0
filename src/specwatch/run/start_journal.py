"""The engine starts a case has measured but not yet merged, kept on disk beside its results file.

A timing suite runs each case's engine group ``engine_starts`` times and appends one merged record
after the last start (``run.engine_starts``); with several ``--fault`` passes interleaved, that is
after the last round of every pass. Each start's ok record is appended here (fsynced) the moment it
arrives, so a runner that is killed, or a host that goes away, between the first start and the
last loses no start already timed: ``--resume`` adopts the journal's starts of every case still
unrecorded and runs only the starts it lacks.

A start counts only when it is newer than the case's last record in the results file: a case that
crashed on a later start, or that already has its merged record, starts over.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from specwatch.core.record import CaseRecord, Status
from specwatch.store.jsonl import append_record, read_records

SUFFIX = ".starts"
"""A results file ``SUITE.jsonl``'s journal is ``SUITE.jsonl.starts`` (the store reads ``*.jsonl``)."""


def journal_path(results_file: Path) -> Path:
    """The journal of ``results_file``."""
    results_file = Path(results_file)
    return results_file.with_name(results_file.name + SUFFIX)


class StartJournal:
    """Appends each ok engine start of one results file's cases; reads back the unmerged ones."""

    def __init__(self, results_file: Path):
        self.results_file = Path(results_file)
        self.path = journal_path(results_file)

    def add(self, rec: CaseRecord) -> None:
        """Append one engine start's ok record durably."""
        append_record(self.path, rec)

    def unmerged(self, case_ids: Iterable[str]) -> dict[str, list[CaseRecord]]:
        """Per case of ``case_ids``: its journaled ok starts newer than its last record in the
        results file, oldest first (none where the journal holds none)."""
        wanted = set(case_ids)
        if not wanted or not self.path.exists():
            return {}
        last: dict[str, object] = {}
        if self.results_file.exists():
            for rec in read_records(self.results_file):
                if rec.case_id in wanted:
                    last[rec.case_id] = max(
                        last.get(rec.case_id, rec.provenance.finished_at), rec.provenance.finished_at
                    )
        out: dict[str, list[CaseRecord]] = {}
        for rec in read_records(self.path):
            cid = rec.case_id
            if cid in wanted and rec.status is Status.ok and (cid not in last or rec.provenance.started_at > last[cid]):
                out.setdefault(cid, []).append(rec)
        for recs in out.values():
            recs.sort(key=lambda r: r.provenance.started_at)
        return out
