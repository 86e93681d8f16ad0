"""Append-only, durable JSONL results store.

Layout: ``results/<machine>/sglang-<version>/<suite>.jsonl``, one record per line. Each append is
flushed and fsynced. A torn last line (a writer killed mid-record) is detected: on read it is
ignored with a warning, and the next append starts on a fresh line so the torn bytes never merge
with a good record. Nothing is ever rewritten or deleted.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Iterator, Optional

if TYPE_CHECKING:
    from specwatch.core.record import RunSummary
from specwatch.core.errors import SpecwatchInputError
from specwatch.core.record import CaseRecord, Status, parse_record
from specwatch.rules.crashlog import host_interference


class TornLineWarning(UserWarning):
    """A line that is not complete JSON (an interrupted write) was skipped."""


def results_path(root: Path, machine: str, sglang_version: Optional[str], suite: str,
                 fault: Optional[str] = None, probe: bool = True) -> Path:
    """Where records of (machine, sglang version, suite) live; a fault run's records apart from the
    clean ones, in ``SUITE+fault-NAME.jsonl``, and a bare (probe-less) run's in ``SUITE+bare.jsonl``."""
    name = suite if fault is None else f"{suite}+fault-{fault}"
    name += "" if probe else "+bare"
    return _version_dir(root, machine, sglang_version) / f"{name}.jsonl"


def _version_dir(root: Path, machine: str, sglang_version: Optional[str]) -> Path:
    return Path(root) / machine / f"sglang-{sglang_version or 'none'}"


def append_record(path: Path, record: CaseRecord) -> None:
    """Append one record durably (flush + fsync); starts a new line after a torn tail."""
    _append_line(path, record.model_dump_json())


def _append_line(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    line = text + "\n"
    with open(path, "ab+") as f:
        f.seek(0, os.SEEK_END)
        if f.tell() > 0:
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                f.write(b"\n")  # seal a torn line so it stays a lone, skippable line
        f.write(line.encode())
        f.flush()
        os.fsync(f.fileno())


def read_records(path: Path) -> Iterator[CaseRecord]:
    """Records of one file, in order. Torn lines are skipped with a warning; a line with a
    newer schema or invalid fields raises ``SpecwatchInputError`` naming file and line."""
    with open(path, "rb") as f:
        for n, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                data = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError):
                warnings.warn(f"{path}:{n}: incomplete record skipped (interrupted write)", TornLineWarning)
                continue
            yield parse_record(data, source=f"{path}:{n}")


def result_files(root: Path) -> list[Path]:
    return sorted(Path(root).rglob("*.jsonl"))


def load_records(paths: Iterable[Path]) -> list[CaseRecord]:
    out: list[CaseRecord] = []
    for p in paths:
        out.extend(read_records(Path(p)))
    return out


def recorded_case_ids(path: Path, statuses: Optional[Iterable[Status]] = None) -> set[str]:
    """Case ids with a record in ``path``: of any status, or only of ``statuses``. A record of host
    interference (``host_interference``) does not count: ``--known`` runs its case again."""
    if not Path(path).exists():
        return set()
    keep = None if statuses is None else set(statuses)
    return {r.case_id for r in read_records(path)
            if (keep is None or r.status in keep) and host_interference(r) is None}


def finished_case_ids(path: Path) -> set[str]:
    """Case ids already recorded ok or skipped in ``path``: ``--resume`` does not run them again."""
    return recorded_case_ids(path, (Status.ok, Status.skipped))


def import_records(paths: Iterable[Path], root: Path) -> dict[Path, int]:
    """Validate records from files (e.g. fetched from a GPU host) and append each to its place in
    the store (machine, sglang version and suite from the record). Records already stored (same
    case, start time and host) are not appended twice. Returns appended counts per file."""
    added: dict[Path, int] = {}
    have: dict[Path, set] = {}
    for p in paths:
        for rec in read_records(Path(p)):
            dest = results_path(root, rec.provenance.machine, rec.provenance.sglang_version, rec.suite,
                                rec.provenance.fault, rec.provenance.probe)
            if dest not in have:
                have[dest] = {_identity(r) for r in read_records(dest)} if dest.exists() else set()
            if _identity(rec) in have[dest]:
                continue
            append_record(dest, rec)
            have[dest].add(_identity(rec))
            added[dest] = added.get(dest, 0) + 1
    return added


def _identity(r: CaseRecord) -> tuple:
    return (r.case_id, r.provenance.hostname, r.provenance.started_at.isoformat(), r.provenance.fault,
            r.provenance.probe)


RUNS_FILE = "runs.ndjson"
"""Per (machine, SGLang version): one RunSummary per `specwatch run` (not a records file)."""


def runs_path(root: Path, machine: str, sglang_version: Optional[str]) -> Path:
    return _version_dir(root, machine, sglang_version) / RUNS_FILE


def append_run(root: Path, summary: "RunSummary") -> Path:
    path = runs_path(root, summary.machine, summary.sglang_version)
    _append_line(path, summary.model_dump_json())
    return path


def read_runs(path: Path) -> list["RunSummary"]:
    from specwatch.core.record import RunSummary

    out = []
    for i, line in enumerate(Path(path).read_text().splitlines(), 1):
        if line.strip():
            try:
                out.append(RunSummary.model_validate_json(line))
            except Exception as e:
                raise SpecwatchInputError(path, f"line {i}: not a run summary ({type(e).__name__})") from None
    return out


def import_runs(paths: Iterable[Path], root: Path) -> int:
    """Append run summaries fetched from a GPU host to the store (each once)."""
    added = 0
    have: dict[Path, set] = {}
    for p in paths:
        for run in read_runs(Path(p)):
            dest = runs_path(root, run.machine, run.sglang_version)
            if dest not in have:
                have[dest] = {r.started_at for r in read_runs(dest)} if dest.exists() else set()
            if run.started_at not in have[dest]:
                append_run(root, run)
                have[dest].add(run.started_at)
                added += 1
    return added
