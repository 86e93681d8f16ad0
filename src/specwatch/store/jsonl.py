"""Append-only, durable JSONL results store: strict on the way in, forgiving on the way out.

Layout: ``results/<machine>/sglang-<version>/<suite>.jsonl``, one record per line; every path
component comes from a validated record field (``core.record.PathPart``) and ``results_path``
refuses a path that resolves outside the root. Each append is flushed and fsynced; a failed
write (disk full, read-only, permission) is rolled back to the file's old size and reported as
one ``StoreWriteError`` line naming the file. A torn last line (a writer killed mid-record) is
detected: on read it is skipped with a ``TornLineWarning``, and the next append starts on a fresh
line so the torn bytes never merge with a good record. Nothing is ever rewritten or deleted.

Reading quarantines: a line that is not a valid record (bad JSON, a JSON value that is not an
object, nesting too deep, a schema error) is reported with file:line (``InvalidRecordWarning``,
and in a ``Quarantine`` when one is given), counted and skipped, and the rest loads; an
unreadable file (a directory named ``x.jsonl``, a dangling link) is one warning line.
``strict=True`` raises ``SpecwatchInputError`` with file:line instead. Importing validates every
line of every file before appending anything. One writer per results file: ``WriterLock``.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Optional

if TYPE_CHECKING:
    from specwatch.core.record import RunSummary
from specwatch.core.errors import SpecwatchInputError
from specwatch.core.record import SCHEMA_VERSION, CaseRecord, Status, check_path_part, parse_record
from specwatch.rules.crashlog import host_interference


class InvalidRecordWarning(UserWarning):
    """A line that is not a valid record, or a file that cannot be read, was skipped."""


class TornLineWarning(InvalidRecordWarning):
    """The file's last line is not complete JSON (an interrupted write) and was skipped."""


class StoreWriteError(SpecwatchInputError):
    """Writing to the store failed (disk full, read-only, permission denied); nothing stored changed."""


@dataclass
class Quarantine:
    """Lines and files a lenient read skipped, each as ``file:line: what`` (``file: what`` for a file)."""

    entries: list[str] = field(default_factory=list)

    def add(self, line: str, category: type[Warning] = InvalidRecordWarning) -> None:
        """Count ``line`` (``file:line: what``) and warn with it."""
        self.entries.append(line)
        warnings.warn(line, category, stacklevel=4)

    def __len__(self) -> int:
        return len(self.entries)


def results_path(
    root: Path, machine: str, sglang_version: Optional[str], suite: str, fault: Optional[str] = None, probe: bool = True
) -> Path:
    """Where records of (machine, sglang version, suite) live; a fault run's records apart from the
    clean ones, in ``SUITE+fault-NAME.jsonl``, and a bare (probe-less) run's in ``SUITE+bare.jsonl``.
    Each name must be a safe path component (``check_path_part``) and the path must resolve inside
    ``root``: otherwise ``SpecwatchInputError`` naming the field."""
    for what, value in (("suite", suite), ("fault", fault)):
        if value is not None:
            _safe(root, what, value)
    name = suite if fault is None else f"{suite}+fault-{fault}"
    name += "" if probe else "+bare"
    return _inside(root, _version_dir(root, machine, sglang_version) / f"{name}.jsonl")


def _safe(root: Path, what: str, value: Any) -> str:
    try:
        return check_path_part(value if isinstance(value, str) else str(value))
    except ValueError as e:
        raise SpecwatchInputError(root, str(e), field=what) from None


def _inside(root: Path, path: Path) -> Path:
    top = Path(root).resolve()
    if not path.resolve().is_relative_to(top):
        raise SpecwatchInputError(path, f"resolves outside the results root {top}")
    return path


def _version_dir(root: Path, machine: str, sglang_version: Optional[str]) -> Path:
    _safe(root, "machine", machine)
    if sglang_version is not None:
        _safe(root, "sglang_version", sglang_version)
    return _inside(root, Path(root) / machine / f"sglang-{sglang_version or 'none'}")


def append_record(path: Path, record: CaseRecord) -> None:
    """Append one record durably (flush + fsync); starts a new line after a torn tail."""
    _append_line(path, record.model_dump_json())


def _append_line(path: Path, text: str) -> None:
    """Append ``text`` and a newline in place, fsynced. On any OS error the file is cut back to
    its old size (the bytes already stored stay as they were) and ``StoreWriteError`` names it."""
    path = Path(path)
    data = (text + "\n").encode()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
    except OSError as e:
        raise StoreWriteError(path, f"cannot write: {e.strerror or e}") from None
    size = None
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            data = b"\n" + data  # seal a torn line so it stays a lone, skippable line
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    except OSError as e:
        if size is not None:
            try:
                os.ftruncate(fd, size)
            except OSError:
                pass
        raise StoreWriteError(path, f"cannot write: {e.strerror or e}") from None
    finally:
        os.close(fd)


class WriterLock:
    """One writer per results file: an advisory ``flock`` on ``FILE.lock`` beside it, holding the
    holder's pid. A second writer raises ``SpecwatchInputError`` naming that pid (exit code 2)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.lock_path = self.path.with_name(self.path.name + ".lock")
        self._fd: Optional[int] = None

    def __enter__(self) -> "WriterLock":
        try:
            self.lock_path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise StoreWriteError(self.lock_path, f"cannot write: {e.strerror or e}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise StoreWriteError(self.lock_path, f"cannot lock: {e.strerror or e}") from None
            raise SpecwatchInputError(
                self.path,
                f"another writer (pid {holder}) holds {self.lock_path.name}; "
                "wait for it to finish or write to another results root",
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def __exit__(self, *exc) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor releases the flock
            self._fd = None


def _lines(
    path: Path,
    strict: bool,
    quarantine: Optional[Quarantine],
    parse: Callable[[Any, str], Any],
    span: tuple[int, Optional[int], int] = (0, None, 1),
    fast: Optional[Callable[[bytes], Any]] = None,
) -> Iterator[Any]:
    """``parse(data, 'file:line')`` of each non-empty line of ``path``; what cannot be read or
    parsed is quarantined (or, with ``strict``, raised as ``SpecwatchInputError``). ``span``:
    (start byte, stop byte or None for the end, number of the line at start), line-aligned.
    ``fast``: a parser of the raw line tried first; a line it refuses (any exception) takes the
    ``json.loads`` + ``parse`` path, whose errors are the ones reported."""
    q = quarantine if quarantine is not None else Quarantine()

    def bad(where: str, what: str, category: type[Warning] = InvalidRecordWarning) -> None:
        if strict:
            raise SpecwatchInputError(where, what)
        q.add(f"{where}: {what}; skipped", category)

    try:
        f = open(path, "rb")
    except OSError as e:
        bad(str(path), f"cannot read ({e.strerror or type(e).__name__})")
        return
    start, stop, first = span
    with f:
        f.seek(start)
        pos = start
        for n, raw in enumerate(f, start=first):
            if stop is not None and pos >= stop:
                break
            pos += len(raw)
            if not raw.strip():
                continue
            if fast is not None:
                try:
                    yield fast(raw)
                    continue
                except Exception:
                    pass  # the exact path below names what is wrong
            where = f"{path}:{n}"
            try:
                data = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError):
                if not raw.endswith(b"\n"):
                    bad(where, "incomplete last line (interrupted write)", TornLineWarning)
                else:
                    bad(where, "not JSON")
                continue
            except RecursionError:
                bad(where, "JSON nested too deeply")
                continue
            try:
                yield parse(data, where)
            except SpecwatchInputError as e:
                if strict:
                    raise
                q.add(f"{e}; skipped")


def read_records(
    path: Path,
    strict: bool = False,
    quarantine: Optional[Quarantine] = None,
    span: tuple[int, Optional[int], int] = (0, None, 1),
) -> Iterator[CaseRecord]:
    """Valid records of one file (or of a line-aligned byte ``span`` of it), in order; invalid lines
    quarantined (see the module doc), or with ``strict`` the first one raised as
    ``SpecwatchInputError`` naming file and line."""
    return _lines(
        Path(path), strict, quarantine, lambda data, where: parse_record(data, source=where), span, fast_record
    )


def fast_record(raw: bytes) -> CaseRecord:
    """One record line validated by pydantic's own JSON parser (about twice as fast as
    ``json.loads`` + ``parse_record``), for a line of the form specwatch writes (it opens with an
    integer ``{"schema_version": N,``, spaces or none) whose migrations only raise ``schema_version``: ``update_to_2``,
    and ``update_to_3`` of a record whose ``details`` is absent (the default) or an object (kept; a
    ``null`` one fails validation here). Any other line raises and is read by ``parse_record``."""
    m = _SCHEMA_PREFIX.match(raw)
    if m is None or not 1 <= int(m.group(1)) <= SCHEMA_VERSION:
        raise ValueError("not read by the fast path")
    rec = CaseRecord.model_validate_json(raw)
    return rec if rec.schema_version == SCHEMA_VERSION else rec.model_copy(update={"schema_version": SCHEMA_VERSION})


_SCHEMA_PREFIX = re.compile(rb'\{\s*"schema_version"\s*:\s*([0-9]{1,3})\s*,')


def result_files(root: Path) -> list[Path]:
    return sorted(Path(root).rglob("*.jsonl"))


def load_records(
    paths: Iterable[Path], strict: bool = False, quarantine: Optional[Quarantine] = None
) -> list[CaseRecord]:
    """Every valid record of ``paths``; ``strict``: the first invalid line raises (``results --strict``)."""
    out: list[CaseRecord] = []
    for p in paths:
        out.extend(read_records(Path(p), strict, quarantine))
    return out


def recorded_case_ids(path: Path, statuses: Optional[Iterable[Status]] = None) -> set[str]:
    """Case ids with a record in ``path``: of any status, or only of ``statuses``. A record of host
    interference (``host_interference``) does not count: ``--known`` runs its case again."""
    if not Path(path).exists():
        return set()
    keep = None if statuses is None else set(statuses)
    return {
        r.case_id for r in read_records(path) if (keep is None or r.status in keep) and host_interference(r) is None
    }


def finished_case_ids(path: Path) -> set[str]:
    """Case ids already recorded ok or skipped in ``path``: ``--resume`` does not run them again."""
    return recorded_case_ids(path, (Status.ok, Status.skipped))


def record_path(root: Path, rec: CaseRecord) -> Path:
    """The results file ``rec`` belongs in under ``root`` (machine, SGLang version, suite, fault, probe)."""
    p = rec.provenance
    return results_path(root, p.machine, p.sglang_version, rec.suite, p.fault, p.probe)


def import_records(paths: Iterable[Path], root: Path) -> dict[Path, int]:
    """Validate records from files (e.g. fetched from a GPU host) and append each to its place in
    the store (machine, sglang version and suite from the record). Every line of every file is
    validated (and placed) before anything is appended: a bad line refuses the import with
    ``file:line: what``. Records already stored (same case, start time and host) are not appended
    twice; each destination is written under its ``WriterLock``. Returns appended counts per file."""
    placed: dict[Path, list[CaseRecord]] = {}
    for p in paths:
        for rec in read_records(Path(p), strict=True):
            placed.setdefault(record_path(root, rec), []).append(rec)
    added: dict[Path, int] = {}
    for dest, recs in placed.items():
        with WriterLock(dest):
            have = {_identity(r) for r in read_records(dest)} if dest.exists() else set()
            for rec in recs:
                if _identity(rec) in have:
                    continue
                append_record(dest, rec)
                have.add(_identity(rec))
                added[dest] = added.get(dest, 0) + 1
    return added


def _identity(r: CaseRecord) -> tuple:
    return (
        r.case_id,
        r.provenance.hostname,
        r.provenance.started_at.isoformat(),
        r.provenance.fault,
        r.provenance.probe,
    )


RUNS_FILE = "runs.ndjson"
"""Per (machine, SGLang version): one RunSummary per `specwatch run` (not a records file)."""


def runs_path(root: Path, machine: str, sglang_version: Optional[str]) -> Path:
    return _version_dir(root, machine, sglang_version) / RUNS_FILE


def append_run(root: Path, summary: "RunSummary") -> Path:
    path = runs_path(root, summary.machine, summary.sglang_version)
    _append_line(path, summary.model_dump_json())
    return path


def _parse_run(data: Any, where: str) -> "RunSummary":
    from specwatch.core.record import RunSummary

    if not isinstance(data, dict):
        raise SpecwatchInputError(where, f"not a run summary: a JSON {type(data).__name__}, not an object")
    try:
        return RunSummary.model_validate(data)
    except Exception as e:  # pydantic.ValidationError
        errs = getattr(e, "errors", None)
        if errs:
            err = errs()[0]
            raise SpecwatchInputError(where, err["msg"], field=".".join(str(x) for x in err["loc"])) from None
        raise SpecwatchInputError(where, f"not a run summary ({type(e).__name__})") from None


def read_runs(path: Path, strict: bool = False, quarantine: Optional[Quarantine] = None) -> list["RunSummary"]:
    """Run summaries of one ``runs.ndjson``; bad lines quarantined as for records (``strict``: raised)."""
    return list(_lines(Path(path), strict, quarantine, _parse_run))


def import_runs(paths: Iterable[Path], root: Path) -> int:
    """Append run summaries fetched from a GPU host to the store (each once); every line is
    validated before anything is appended."""
    runs = [run for p in paths for run in read_runs(Path(p), strict=True)]
    added = 0
    have: dict[Path, set] = {}
    for run in runs:
        dest = runs_path(root, run.machine, run.sglang_version)
        if dest not in have:
            have[dest] = {r.started_at for r in read_runs(dest)} if dest.exists() else set()
        if run.started_at not in have[dest]:
            append_run(root, run)
            have[dest].add(run.started_at)
            added += 1
    return added
