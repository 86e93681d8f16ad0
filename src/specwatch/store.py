"""Append-only, durable JSONL results store.

Layout: ``results/<machine>/sglang-<version>/<suite>.jsonl``, one record per line. Each append is
flushed and fsynced. A torn last line (a writer killed mid-record) is detected: on read it is
ignored with a warning, and the next append starts on a fresh line so the torn bytes never merge
with a good record. Nothing is ever rewritten or deleted.
"""

from __future__ import annotations

import json
import os
import statistics
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Iterator, Optional

if TYPE_CHECKING:
    import pandas as pd
    from specwatch.record import RunSummary

from specwatch.errors import SpecwatchInputError
from specwatch.record import CaseRecord, Status, parse_record


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


HOST_INTERFERENCE = {
    "The memory capacity is unbalanced":
        "another process held memory on one of the engine's GPUs (a concurrent run on the host), so "
        "SGLang refused to start the engine",
    "EADDRINUSE":
        "the port SGLang had picked for torch.distributed's rendezvous was taken before its TCP store "
        "bound it (get_free_port releases the port it found; an engine starting beside it took it)",
}
"""SGLang's messages that say a record measured the host, not the case: message fragment -> what
happened. Seen on the x2 host: a one-GPU run on GPU 0 beside a tp-2 DCP sweep (tenth session);
a tp-2 engine whose ``nccl_port`` another of six parallel starts took (twelfth session, before
``engine_worker.rendezvous_port``)."""


def host_interference(r: CaseRecord) -> Optional[str]:
    """What made the record the host's answer rather than the case's (``HOST_INTERFERENCE``), else None."""
    text = r.reason or ""
    return next((what for frag, what in HOST_INTERFERENCE.items() if frag in text), None)


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


def relative_spread(values: list[float]) -> Optional[float]:
    """(max - min) / median of ``values``; None with fewer than two or a zero median."""
    if len(values) < 2:
        return None
    med = statistics.median(values)
    return (max(values) - min(values)) / med if med else None


def start_breakdown(r: CaseRecord) -> dict[str, float]:
    """``start.PHASE`` seconds of the record's engine start, from the probe's ``startup`` facts
    (SGLang's own breakdown plus the imports before the scheduler); CUDA-graph phases summed."""
    facts = ((r.details or {}).get("probe") or {}).get("startup") or {}
    out = {}
    for k, v in facts.items():
        if isinstance(v, dict):
            v = sum(x for x in v.values() if isinstance(x, (int, float)))
        if isinstance(v, (int, float)):
            out[f"start.{k}"] = float(v)
    return out


def records_frame(records: Iterable[CaseRecord]) -> "pd.DataFrame":
    """One row per case run: case parameters, status, provenance and one column per metric value."""
    import pandas as pd

    from specwatch.engine_worker import draft_page_matches

    rows = []
    for r in records:
        row = {"suite": r.suite, "case_id": r.case_id, "status": r.status.value, "reason": reason_now(r)}
        row.update(r.case.params())
        prov = r.provenance
        row.update({
            "machine": prov.machine, "sglang_version": prov.sglang_version,
            "sglang_commit": prov.sglang_commit, "gpu_name": prov.gpu_name, "fault": prov.fault, "probe": prov.probe,
            "started_at": prov.started_at, "specwatch_commit": prov.specwatch_commit, "run_id": prov.run_id,
        })
        for name, m in r.metrics.items():
            row[name] = m.value
        dt = r.metrics.get("decode_throughput")
        if dt is not None and (spread := relative_spread(dt.samples)) is not None:
            # the repeats' own spread (one engine, back to back): what a single run can resolve
            row["decode_throughput_spread"] = spread
        row.update(start_breakdown(r))
        for name, ok in r.checks.items():
            row[f"check.{name}"] = ok
        details = r.details or {}
        row["output_digest"] = details.get("output_digest")
        # the timed batches' chain starts (None on records made before specwatch kept them) and how many
        row["prompt_starts"] = details.get("prompt_starts")
        row["timed_repeats"] = len(r.metrics["wall_time"].samples) if "wall_time" in r.metrics else None
        # near-full prompts lengthened after the warm-up (engine_worker.near_full_extension)
        row["calibrated_input_len"] = (details.get("near_full_calibration") or {}).get("input_len")
        row["overlap_starts"] = r.overlap_starts          # timed while other engines started
        # whether the probe read the target's attention backend (engine_worker.writes_at_virtual_slots):
        # without it a DCP target pool is judged as sharded, which a backend with no DCP code is not
        probe = details.get("probe")
        row["probe_read_attention_backend"] = None if not probe else "target_attention_backend" in probe
        # seed 004's facts: the shared allocator's page and, per KV pool, its page, where its valid
        # slots end and where the allocator's last page ends in that pool's slot space
        # (engine_worker.pool_coverage; a crashed record keeps those read right after its engine started)
        coverage = dict(details.get("pool_coverage") or details.get("pool_coverage_at_start") or {})
        if r.case.algorithm.value == "NGRAM":
            coverage.pop("draft", None)   # probes before 65d73a6 took NGRAM's shared target pool for a draft pool
        any_cov = next(iter(coverage.values()), {})
        row["allocator_page_size"] = ((probe or {}).get("allocator") or {}).get("page_size") or (
            any_cov.get("allocator_page_in_pool_slots", 0) * (any_cov.get("scale") or 0) or None)
        for role in ("target", "draft"):
            cov = coverage.get(role) or {}
            row[f"{role}_pool_page_size"] = cov.get("pool_page_size")
            row[f"{role}_pool_valid_end"] = cov.get("pool_valid_end")
            row[f"{role}_pool_needed_end"] = cov.get("allocator_slot_end")
        # seed 004's flag, judged from those facts under today's definition (the draft pool's page
        # against the allocator's in the pool's slot space); records before 65d73a6 stored a check
        # that compared the raw pages, wrong under DCP
        draft = coverage.get("draft")
        row["draft_pool_page_mismatch"] = None if not draft else not draft_page_matches(draft)
        row["leak_is_unflushed_cache"] = leak_is_unflushed_cache(r)
        row["row_matches_model_now"] = row_matches_model_now(r)
        row["host_interference"] = host_interference(r)
        rows.append(row)
    return pd.DataFrame(rows)


def reason_now(r: CaseRecord) -> Optional[str]:
    """A record's reason, with a crash's cause read again from its stored log tail where the
    recorded cause is a C++ stack frame (``frame #0: c10::Error::Error(...)``): until the twelfth
    GPU session ``runner.crash_cause`` took the last line naming an error, and a C++ trace after the
    Python exception named ``c10::Error``; today's ``crash_cause`` reads the tail. The record keeps
    what it said; this is what it meant."""
    from specwatch.runner import WORKER_DIED_RE, CPP_FRAME, crash_cause

    m = WORKER_DIED_RE.match(r.reason or "")
    if not m or not r.log_tail or not CPP_FRAME.match(r.reason[m.end():]):
        return r.reason
    return m.group(0) + crash_cause(r.log_tail)


def leak_is_unflushed_cache(r: CaseRecord) -> bool:
    """A record whose "leaked" tokens are exactly what SGLang's radix cache held at the leak check.

    Until ``engine_worker.flush_cache`` (ninth GPU session, 2026-11-30) the worker took SGLang's
    flush answer, an object true whatever it said, as a flush, and counted every token not free as
    leaked. When the scheduler refused the flush (not yet idle after the last batch) the cached
    prompts read as a leak. Such records keep their verdict; this says what it was."""
    from specwatch.engine_worker import radix_cache_tokens

    leaked = r.metrics.get("leaked_tokens")
    held = radix_cache_tokens((r.details or {}).get("probe") or {})
    return bool(leaked is not None and leaked.value and leaked.value == held)


def row_matches_model_now(r: CaseRecord) -> Optional[bool]:
    """``req_to_token_matches_model`` judged again under today's memory model, for the record's
    SGLang version (None: the record has no measured row). The recorded check used the model of its
    day; the model learns an older release's rule after its rows are measured (0.5.12's rows ignore
    the decode reserve: ``memory_model.ROW_RESERVE_SINCE``). The recorded verdict stays; this says
    whether the mismatch was SGLang's or the model's."""
    from specwatch.engine_worker import req_to_token_vs_model

    width, nbytes = r.metrics.get("req_to_token_row_width"), r.metrics.get("req_to_token_bytes")
    if width is None or nbytes is None or not width.value:
        return None
    rows = int(nbytes.value) // (int(width.value) * 4)          # int32 slots, one padding row
    return req_to_token_vs_model(r.case, rows - 1, width.value, nbytes.value, r.provenance.sglang_version)[2]


def latest_rows(df: "pd.DataFrame", by: list[str]) -> "pd.DataFrame":
    """The newest row (by ``started_at``) of each ``by`` group of a records frame, whole: unlike
    ``groupby(by).last()``, which takes each column's last non-null value and so can pair a
    crashed record's status with an older record's metrics or output digest. A record of host
    interference (``host_interference``) is taken only where its group has no other: it says what
    the host did, not what the case does."""
    if "host_interference" not in df:
        return df.sort_values("started_at").drop_duplicates(by, keep="last")
    measured = df.host_interference.isna().rename("_measured")
    return (df.assign(_measured=measured).sort_values(["_measured", "started_at"])
            .drop_duplicates(by, keep="last").drop(columns="_measured"))


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


def runs_frame(root: Path) -> "pd.DataFrame":
    """What each GPU run cost (every ``runs.ndjson`` under ``root``), one row per run, oldest first:
    wall time against the cases' own time (issue 3's aim: under 2)."""
    import pandas as pd

    runs = sorted((r for p in Path(root).rglob(RUNS_FILE) for r in read_runs(p)), key=lambda r: r.started_at)
    return pd.DataFrame([{
        "started": r.started_at.strftime("%Y-%m-%d %H:%M"), "machine": r.machine, "sglang": r.sglang_version,
        "suites": "+".join(r.suites),
        "K": f"{r.parallel_starts}{' overlap' if r.overlap_starts else ''}"
             f"{' shared lock' if r.timing_lock_shared else ''}",
        "groups": r.engine_groups, "workers": r.worker_starts, "records": sum(r.records.values()),
        "wall s": round(r.wall_s), "case s": round(r.case_s),
        "ratio": None if r.cost_ratio is None else round(r.cost_ratio, 2)} for r in runs])


def read_runs(path: Path) -> list["RunSummary"]:
    from specwatch.record import RunSummary

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
