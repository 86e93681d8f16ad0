"""Records as one pandas frame, with each record's facts re-read under today's rules.

The frame is what every reader (compare, dashboard, plots, results) works from; ``latest_rows``
picks each case's latest record by the one rule of ``store.latest``. ``files_frame`` builds the
frame of results files one file at a time (no record objects kept), each file's rows cached in
``store.frame_cache`` beside it.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Optional

if TYPE_CHECKING:
    import pandas as pd
from specwatch.core.record import CaseRecord
from specwatch.rules.crashlog import host_interference
from specwatch.store.jsonl import RUNS_FILE, Quarantine, read_records, read_runs
from specwatch.store.latest import latest_rows  # noqa: F401  (the one latest rule, re-exported)


def relative_spread(values: list[float]) -> Optional[float]:
    """(max - min) / median of ``values``; None with fewer than two or a zero median."""
    if len(values) < 2:
        return None
    med = statistics.median(values)
    return (max(values) - min(values)) / med if med else None


def start_breakdown(r: CaseRecord) -> dict[str, float]:
    """``start.PHASE`` seconds of the record's engine start, from the probe's ``startup`` facts
    (SGLang's own breakdown plus the imports before the scheduler); CUDA-graph phases summed."""
    facts = (r.details.probe or {}).get("startup") or {}
    out = {}
    for k, v in facts.items():
        if isinstance(v, dict):
            v = sum(x for x in v.values() if isinstance(x, (int, float)))
        if isinstance(v, (int, float)):
            out[f"start.{k}"] = float(v)
    return out


def records_frame(records: Iterable[CaseRecord]) -> "pd.DataFrame":
    """One row per case run: case parameters, status, provenance and one column per metric value
    (``record_row``). A generator of records is consumed one at a time; none is kept."""
    import pandas as pd

    return pd.DataFrame([record_row(r) for r in records])


def files_frame(paths: Iterable[Path], cache: bool = True, strict: bool = False,
                quarantine: Optional[Quarantine] = None) -> "pd.DataFrame":
    """``records_frame`` of the records of ``paths``, built file by file: each file's records are
    streamed into rows and dropped, and with ``cache`` its rows are read from (or written to) its
    Parquet cache (``frame_cache``), rebuilt whenever the JSONL changes. Invalid lines are
    quarantined as ``jsonl.read_records`` does (``strict``: raised)."""
    import pandas as pd

    from specwatch.store.frame_cache import cached_rows

    q = quarantine if quarantine is not None else Quarantine()
    parts = []
    for p in paths:
        p = Path(p)
        build = lambda p=p: records_frame(read_records(p, strict=strict, quarantine=q))  # noqa: E731
        part = cached_rows(p, build, q) if cache and not strict else build()
        if not part.empty:
            parts.append(part)
    return pd.concat(parts, ignore_index=True, sort=False) if parts else pd.DataFrame()


def record_row(r: CaseRecord) -> dict:
    """A record's row of the records frame (the facts re-read under today's rules)."""
    from specwatch.rules.pools import draft_page_matches

    row = {"suite": r.suite, "case_id": r.case_id, "status": r.status.value, "reason": reason_now(r)}
    row.update(r.case.params())
    prov = r.provenance
    row.update({
        "machine": prov.machine, "sglang_version": prov.sglang_version,
        "sglang_commit": prov.sglang_commit, "gpu_name": prov.gpu_name, "fault": prov.fault, "probe": prov.probe,
        "started_at": prov.started_at, "finished_at": prov.finished_at, "specwatch_commit": prov.specwatch_commit,
        "run_id": prov.run_id,
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
    details = r.details
    row["output_digest"] = details.output_digest
    # the timed batches' chain starts (None on records made before specwatch kept them) and how many
    row["prompt_starts"] = details.prompt_starts
    row["timed_repeats"] = len(r.metrics["wall_time"].samples) if "wall_time" in r.metrics else None
    # near-full prompts lengthened after the warm-up (engine_worker.near_full_extension)
    row["calibrated_input_len"] = (details.near_full_calibration or {}).get("input_len")
    row["overlap_starts"] = r.overlap_starts          # timed while other engines started
    # whether the probe read the target's attention backend (engine_worker.writes_at_virtual_slots):
    # without it a DCP target pool is judged as sharded, which a backend with no DCP code is not
    probe = details.probe
    row["probe_read_attention_backend"] = None if not probe else "target_attention_backend" in probe
    # seed 004's facts: the shared allocator's page and, per KV pool, its page, where its valid
    # slots end and where the allocator's last page ends in that pool's slot space
    # (engine_worker.pool_coverage; a crashed record keeps those read right after its engine started)
    coverage = dict(details.pool_coverage or details.pool_coverage_at_start or {})
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
    return row


def reason_now(r: CaseRecord) -> Optional[str]:
    """A record's reason, with a crash's cause read again from its stored log tail where the
    recorded cause is a C++ stack frame (``frame #0: c10::Error::Error(...)``): until the twelfth
    GPU session ``runner.crash_cause`` took the last line naming an error, and a C++ trace after the
    Python exception named ``c10::Error``; today's ``crash_cause`` reads the tail. The record keeps
    what it said; this is what it meant."""
    from specwatch.rules.crashlog import CPP_FRAME, WORKER_DIED_RE, crash_cause

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
    from specwatch.rules.pools import radix_cache_tokens

    leaked = r.metrics.get("leaked_tokens")
    held = radix_cache_tokens(r.details.probe or {})
    return bool(leaked is not None and leaked.value and leaked.value == held)


def row_matches_model_now(r: CaseRecord) -> Optional[bool]:
    """``req_to_token_matches_model`` judged again under today's memory model, for the record's
    SGLang version (None: the record has no measured row). The recorded check used the model of its
    day; the model learns an older release's rule after its rows are measured (0.5.12's rows ignore
    the decode reserve: ``memory_model.ROW_RESERVE_SINCE``). The recorded verdict stays; this says
    whether the mismatch was SGLang's or the model's."""
    from specwatch.rules.pools import req_to_token_vs_model

    width, nbytes = r.metrics.get("req_to_token_row_width"), r.metrics.get("req_to_token_bytes")
    if width is None or nbytes is None or not width.value:
        return None
    rows = int(nbytes.value) // (int(width.value) * 4)          # int32 slots, one padding row
    return req_to_token_vs_model(r.case, rows - 1, width.value, nbytes.value, r.provenance.sglang_version)[2]


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
