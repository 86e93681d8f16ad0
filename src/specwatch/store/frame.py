"""Records as one pandas frame, with each record's facts re-read under today's rules.

The frame is what every reader (compare, dashboard, plots, results) works from; ``latest_rows``
picks each case's latest record by the one rule of ``store.latest``. ``files_frame`` builds the
frame of results files one file at a time (no record objects kept), each file's rows cached in
``store.frame_cache`` beside it.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Optional

if TYPE_CHECKING:
    import pandas as pd
from specwatch.core.record import CaseRecord
from specwatch.rules.case_totals import engines_agree_now
from specwatch.rules.crashlog import host_interference
from specwatch.store.baseline import OVERHEAD, overhead_cells, relative_spread
from specwatch.store.jsonl import Quarantine, read_records
from specwatch.store.latest import latest_rows  # noqa: F401  (the one latest rule, re-exported)
from specwatch.store.repeat_spread import SPREAD_ROUNDS, spread_round_ratios
from specwatch.store.step_state import plain_windows, probed_windows, shares_column, tps_column


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


PARALLEL_BYTES = 32 << 20
"""JSONL bytes to build (cache misses) above which rows are built by a process pool."""

CHUNK_BYTES = 8 << 20
"""Line-aligned piece of a JSONL one pool task turns into rows."""


def files_frame(
    paths: Iterable[Path],
    cache: bool = True,
    strict: bool = False,
    quarantine: Optional[Quarantine] = None,
    columns: Optional[list[str]] = None,
    pending: Optional[Callable[[], None]] = None,
) -> "pd.DataFrame":
    """``records_frame`` of the records of ``paths``, built file by file: records are streamed
    into rows and dropped (none kept), and with ``cache`` each file's rows are read from (or
    written to) its Parquet cache (``frame_cache``), rebuilt whenever the JSONL changes (from the
    appended lines alone where it grew by appends: ``frame_append``). Over
    ``PARALLEL_BYTES`` of JSONL to build, line-aligned pieces are built in a process pool. Invalid
    lines are quarantined as ``jsonl.read_records`` does (``strict``: raised, no cache).
    ``columns``: only those (of the ones a file has) are read, ``COMPARE_COLUMN`` among them when
    named; by default every column of ``records_frame``. ``pending``: called once the fresh
    caches are read, before the others are read again (their builder awaited: ``prime``)."""
    import pandas as pd

    from specwatch.store.frame_append import appended_rows
    from specwatch.store.frame_cache import fresh_rows, store_rows

    q = quarantine if quarantine is not None else Quarantine()
    paths = [Path(p) for p in paths]
    parts: dict[Path, "pd.DataFrame"] = {}
    keys: dict[Path, Optional[dict]] = {}
    for p in paths:
        hit, keys[p] = fresh_rows(p, q, columns) if cache and not strict else (None, None)
        if hit is not None:
            parts[p] = hit
    if pending is not None and len(parts) < len(paths):  # the fresh ones read: the others' builder awaited
        pending()
        for p in (p for p in paths if p not in parts):
            hit, keys[p] = fresh_rows(p, q, columns) if cache and not strict else (None, None)
            if hit is not None:
                parts[p] = hit
    misses = [p for p in paths if p not in parts]  # a file grown by appends: only the new lines built
    grown = {p: g for p in misses if cache and not strict and (g := appended_rows(p, keys[p], _rows_of_span))}
    built = _build([p for p in misses if p not in grown], strict)
    for p in misses:
        df, entries = grown[p] if p in grown else built[p]
        for line in entries:
            q.add(line)
        if cache and not strict:
            store_rows(p, df, keys[p], entries)
        parts[p] = _columns(df, columns)
    frames = [parts[p] for p in paths if not parts[p].empty]
    return pd.concat(frames, ignore_index=True, sort=False) if frames else pd.DataFrame()


def _rows_of_span(path: Path, span: tuple, strict: bool) -> tuple["pd.DataFrame", list[str]]:
    """Rows of a byte span of one JSONL (with ``COMPARE_COLUMN``) and the lines it quarantined
    (warnings left to the caller)."""
    import warnings

    import pandas as pd

    q = Quarantine()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rows, cells, conditions = [], [], []
        for r in read_records(path, strict=strict, quarantine=q, span=span):
            rows.append(record_row(r))
            cells.append(compare_cell(r))
            conditions.append(conditions_cell(r))
    df = pd.DataFrame(rows)
    if rows:
        df[COMPARE_COLUMN] = cells
        df[CONDITIONS_COLUMN] = conditions
    return df, q.entries


COMPARE_COLUMN = "_compare"
"""A files frame's hidden column (cached, read only when named): per record, as JSON, what
``analysis.compare`` needs beyond the frame: the recorded reason, the case label, SGLang's own
sizing, and per metric and check what the frame's one value per column leaves out."""


def compare_cell(r: CaseRecord) -> str:
    """``COMPARE_COLUMN``'s JSON of one record: ``r`` reason, ``l`` label, ``s`` sizing, ``m``
    metrics (name -> [value, unit, samples, exact, higher_is_better], with ``engine_medians`` sixth
    where the record has them, in the record's order; NaN as null), ``c`` checks (name -> passed, in
    order), for a record of interleaved passes ``i`` its run id (``CaseRecord.interleaved_run``)
    and ``t`` true where they took turns (``CaseRecord.paired_turns``), for one with plain-loop
    runs ``b`` its ``details.baseline`` (the overhead cell's rounds)."""
    import orjson

    metrics = {n: _metric_cell(m) for n, m in r.metrics.items()}
    cell = {"r": r.reason, "l": r.case.label(), "s": r.details.sglang_sizing, "m": metrics, "c": r.checks}
    if r.interleaved_run:
        cell["i"] = r.interleaved_run
        if r.paired_turns:
            cell["t"] = True
    if r.details.baseline:
        cell["b"] = r.details.baseline
    return orjson.dumps(cell).decode()


def _metric_cell(m) -> list:
    """[value, unit, samples, exact, higher_is_better], plus ``engine_medians`` where recorded."""
    cell = [m.value, m.unit, m.samples, m.exact, m.higher_is_better]
    return cell + [m.engine_medians] if m.engine_medians is not None else cell


CONDITIONS_COLUMN = "_conditions"
"""A files frame's hidden column (cached, read only when named): per record, as JSON, its run
conditions (``run_conditions``), which tell an A/A pair from two runs under different conditions."""


def run_conditions(r: CaseRecord) -> dict:
    """The conditions a record ran under that two runs of an A/A pair share (SGLang version,
    machine, GPU, driver, probe, parallel starts, overlapped starts, engine arguments as sorted
    JSON) and ``host_load``: the mean of the host's load average before and after the case (None
    where neither was read)."""
    import json

    p, d = r.provenance, r.details
    loads = [v for v in ((d.host_load.before, d.host_load.after) if d.host_load else ()) if v is not None]
    return {
        "sglang_version": p.sglang_version,
        "machine": p.machine,
        "gpu_name": p.gpu_name,
        "driver_version": p.driver_version,
        "probe": p.probe,
        "parallel_starts": d.parallel_starts or 1,
        "overlap_starts": r.overlap_starts,
        "engine_kwargs": json.dumps(d.engine_kwargs, sort_keys=True) if d.engine_kwargs is not None else None,
        "host_load": statistics.mean(loads) if loads else None,
    }


def conditions_cell(r: CaseRecord) -> str:
    """``CONDITIONS_COLUMN``'s JSON of one record (``run_conditions``)."""
    import orjson

    return orjson.dumps(run_conditions(r)).decode()


def _columns(df: "pd.DataFrame", columns: Optional[list[str]]) -> "pd.DataFrame":
    """``df`` with only ``columns`` (those it has), or without the hidden ones (``_``) when None."""
    if columns is None:
        return df.drop(columns=[c for c in df.columns if str(c).startswith("_")])
    return df[[c for c in columns if c in df.columns]]


def _spans(path: Path) -> list[tuple]:
    """Line-aligned (start, stop, first line number) pieces of ``path`` of about ``CHUNK_BYTES``."""
    data = path.read_bytes()
    spans, start, line = [], 0, 1
    while start < len(data):
        cut = data.find(b"\n", start + CHUNK_BYTES)
        stop = len(data) if cut < 0 else cut + 1
        spans.append((start, stop, line))
        line += data.count(b"\n", start, stop)
        start = stop
    return spans


def _build(paths: list[Path], strict: bool) -> dict[Path, tuple["pd.DataFrame", list[str]]]:
    """Rows and quarantined lines of each of ``paths``, in a process pool when there is much to build."""
    import pandas as pd

    def size(p: Path) -> int:
        try:
            return p.stat().st_size if p.is_file() else 0
        except OSError:
            return 0

    if strict or sum(size(p) for p in paths) < PARALLEL_BYTES:
        return {p: _rows_of_span(p, (0, None, 1), strict) for p in paths}
    import os
    from concurrent.futures import ProcessPoolExecutor

    tasks = [(p, span) for p in paths for span in (_spans(p) if size(p) else [(0, None, 1)])]
    with ProcessPoolExecutor(max_workers=min(len(tasks), os.cpu_count() or 1)) as pool:
        done = list(pool.map(_rows_of_span, [p for p, _ in tasks], [s for _, s in tasks], [False] * len(tasks)))
    out: dict[Path, tuple] = {}
    for (p, _), (df, entries) in zip(tasks, done):
        prev = out.get(p)
        out[p] = (
            (df, entries)
            if prev is None
            else (
                pd.concat([x for x in (prev[0], df) if not x.empty], ignore_index=True, sort=False)
                if not (prev[0].empty and df.empty)
                else prev[0],
                prev[1] + entries,
            )
        )
    return out


def record_row(r: CaseRecord) -> dict:
    """A record's row of the records frame (the facts re-read under today's rules), its columns in
    this order: identity, case parameters, provenance, metrics, checks, details, pool coverage and
    the verdicts re-judged today."""
    row = {"suite": r.suite, "case_id": r.case_id, "status": r.status.value, "reason": reason_now(r)}
    row.update(case_cells(r.case))
    row.update(provenance_cells(r))
    row.update(metric_cells(r))
    row.update(detail_cells(r))
    row.update(coverage_cells(r))
    row["leak_is_unflushed_cache"] = leak_is_unflushed_cache(r)
    row["row_matches_model_now"] = row_matches_model_now(r)
    row["host_interference"] = host_interference(r)
    row["engines_agree_now"] = engines_agree_now(r.checks, r.metrics, r.details.timed_windows is not None)
    return row


def case_cells(case) -> dict:
    """A case's columns of the frame: its ``params()`` with ``model`` the model's name
    (``Case.model_label``: an own model's name, else the oracle size), so every table, plot,
    noise class and selection groups and names own models apart; an own model's row keeps
    ``model_name`` (set only there) beside it, and ``store.row_case`` gives back its parameters."""
    return {**case.params(), "model": case.model_label}


def provenance_cells(r: CaseRecord) -> dict:
    """Where and with what the record ran."""
    prov = r.provenance
    return {
        "machine": prov.machine,
        "sglang_version": prov.sglang_version,
        "sglang_commit": prov.sglang_commit,
        "gpu_name": prov.gpu_name,
        "fault": prov.fault,
        "probe": prov.probe,
        "started_at": prov.started_at,
        "finished_at": prov.finished_at,
        "specwatch_commit": prov.specwatch_commit,
        "run_id": prov.run_id,
    }


def metric_cells(r: CaseRecord) -> dict:
    """One cell per metric value, the repeats' spread, the start breakdown and one per check."""
    row = {name: m.value for name, m in r.metrics.items()}
    dt = r.metrics.get("decode_throughput")
    if dt is not None and (spread := relative_spread(dt.samples)) is not None:
        # the repeats' own spread (one engine, back to back): what a single run can resolve
        row["decode_throughput_spread"] = spread
    row.update(overhead_cells(r.metrics, r.details.baseline))  # beside ``overhead`` (specwatch run --baseline)
    if OVERHEAD in r.metrics:  # the two loops' repeat spreads, round by round
        row[SPREAD_ROUNDS] = spread_round_ratios(r.details, r.metrics)
    for loop, (shares, tps) in (  # the host's slow state per timed window, with its tokens/s (store.step_state)
        ("probed", probed_windows(r.details, r.metrics.get("output_throughput"))),
        ("plain", plain_windows(r.details.baseline)),
    ):
        row[shares_column(loop)], row[tps_column(loop)] = (shares, tps) if shares else (None, None)
    row.update(start_breakdown(r))
    for name, ok in r.checks.items():
        row[f"check.{name}"] = ok
    return row


def detail_cells(r: CaseRecord) -> dict:
    """Facts of ``details``: output digest, the timed batches' chain starts and repeats, calibration."""
    details = r.details
    probe = details.probe
    return {
        "output_digest": details.output_digest,
        # the timed batches' chain starts (None on records made before specwatch kept them) and how many
        "prompt_starts": details.prompt_starts,
        "timed_repeats": len(r.metrics["wall_time"].samples) if "wall_time" in r.metrics else None,
        # near-full prompts lengthened after the warm-up (engine_worker.near_full_extension)
        "calibrated_input_len": (details.near_full_calibration or {}).get("input_len"),
        "overlap_starts": r.overlap_starts,  # timed while other engines started
        # whether the probe read the target's attention backend (engine_worker.writes_at_virtual_slots):
        # without it a DCP target pool is judged as sharded, which a backend with no DCP code is not
        "probe_read_attention_backend": None if not probe else "target_attention_backend" in probe,
    }


def coverage_cells(r: CaseRecord) -> dict:
    """Seed 004's facts: the shared allocator's page and, per KV pool, its page, where its valid
    slots end and where the allocator's last page ends in that pool's slot space
    (engine_worker.pool_coverage; a crashed record keeps those read right after its engine started),
    and seed 004's flag judged from them under today's definition (the draft pool's page against
    the allocator's in the pool's slot space); records before 65d73a6 stored a check that compared
    the raw pages, wrong under DCP."""
    from specwatch.rules.pools import draft_page_matches

    details = r.details
    coverage = dict(details.pool_coverage or details.pool_coverage_at_start or {})
    if r.case.algorithm.value == "NGRAM":
        coverage.pop("draft", None)  # probes before 65d73a6 took NGRAM's shared target pool for a draft pool
    any_cov = next(iter(coverage.values()), {})
    row = {
        "allocator_page_size": ((details.probe or {}).get("allocator") or {}).get("page_size")
        or (any_cov.get("allocator_page_in_pool_slots", 0) * (any_cov.get("scale") or 0) or None)
    }
    for role in ("target", "draft"):
        cov = coverage.get(role) or {}
        row[f"{role}_pool_page_size"] = cov.get("pool_page_size")
        row[f"{role}_pool_valid_end"] = cov.get("pool_valid_end")
        row[f"{role}_pool_needed_end"] = cov.get("allocator_slot_end")
    draft = coverage.get("draft")
    row["draft_pool_page_mismatch"] = None if not draft else not draft_page_matches(draft)
    return row


def reason_now(r: CaseRecord) -> Optional[str]:
    """A record's reason, with a crash's cause read again from its stored log tail where the
    recorded cause is a C++ stack frame (``frame #0: c10::Error::Error(...)``): older records took
    the last line naming an error as the cause, and a C++ trace after the Python exception named
    ``c10::Error``; today's ``crash_cause`` reads the tail. The record keeps
    what it said; this is what it meant."""
    from specwatch.rules.crashlog import CPP_FRAME, WORKER_DIED_RE, crash_cause

    m = WORKER_DIED_RE.match(r.reason or "")
    if not m or not r.log_tail or not CPP_FRAME.match(r.reason[m.end() :]):
        return r.reason
    return m.group(0) + crash_cause(r.log_tail)


def leak_is_unflushed_cache(r: CaseRecord) -> bool:
    """A record whose "leaked" tokens are exactly what SGLang's radix cache held at the leak check.

    Records made before the worker read the flush answer's ``success`` field took SGLang's flush
    answer, an object true whatever it said, as a flush, and counted every token not free as
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
    rows = int(nbytes.value) // (int(width.value) * 4)  # int32 slots, one padding row
    return req_to_token_vs_model(r.case, rows - 1, width.value, nbytes.value, r.provenance.sglang_version)[2]
