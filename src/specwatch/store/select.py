"""Selections of records for comparisons: ``KEY=VALUE,...`` specs over the store, the newest run, each case's latest record."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Optional

from specwatch.core.errors import SpecwatchInputError
from specwatch.core.record import CaseRecord
from specwatch.store.jsonl import load_records, result_files
from specwatch.store.latest import latest_by_case  # noqa: F401  (the one latest rule, re-exported)


def run_key(r: CaseRecord) -> str:
    """The run a record belongs to: its ``run_id``; records from before run ids existed are keyed by
    their specwatch commit (then a run was one commit's sweep, as for the first smoke A/A pair)."""
    return r.provenance.run_id or f"commit:{r.provenance.specwatch_commit}"


def newest_run(recs: list[CaseRecord], n: int, spec: str) -> str:
    """The ``run_key`` of the n-th newest run among ``recs`` (runs ordered by their first record's
    start): ``run=-N`` in a selection, e.g. ``run=-2`` vs ``run=-1`` for an A/A pair."""
    first: dict[str, datetime] = {}
    for r in recs:
        k = run_key(r)
        first[k] = min(first.get(k, r.provenance.started_at), r.provenance.started_at)
    runs = sorted(first, key=first.get)
    if not 1 <= n <= len(runs):
        raise SpecwatchInputError(None, f"run -{n}: the selection holds {len(runs)} run(s)", field=spec)
    return runs[-n]


SELECT_FIELDS = {
    "sglang_version": lambda r: r.provenance.sglang_version,
    "sglang_commit": lambda r: r.provenance.sglang_commit,
    "specwatch_commit": lambda r: r.provenance.specwatch_commit,
    "machine": lambda r: r.provenance.machine,
    "suite": lambda r: r.suite,
    "model": lambda r: r.case.model_label,  # an own model by its name, as in reports
    "fault": lambda r: r.provenance.fault or "none",
    "probe": lambda r: "on" if r.provenance.probe else "off",
    "overlap": lambda r: "on" if r.overlap_starts else "off",
    "run": run_key,
}
"""FIELD -> the value of a record a FIELD=VALUE selection term compares with."""


def select(spec: str, root: Path) -> list[CaseRecord]:
    """A selection: a JSONL file or folder, or FIELD=VALUE[,FIELD!=VALUE...] over the store's records
    (fields: ``SELECT_FIELDS``; ``!=`` excludes, e.g. an A/A comparison of one run against the
    earlier runs of the same version).
    ``FIELD=A|B`` matches either value (``run=ID1|ID2``: a side made of two runs).
    ``run`` takes a run id or ``-N``, the N-th newest run of the records the other terms select
    (``run=-2`` and ``run=-1``: the last two runs, an A/A pair run back to back).
    Fault-injection and bare (probe-off) runs share case ids with clean runs, so a FIELD=VALUE
    selection holds clean, probed runs only unless it names ``fault`` or ``probe`` (``probe=off``),
    and runs whose starts overlapped timed batches (``--overlap-starts``: noisier timing) only when
    it names ``overlap`` (``overlap=on``)."""
    p = Path(spec)
    if p.exists():
        return load_records([p] if p.is_file() else result_files(p))
    terms = parse_terms(spec)
    recs = load_records(selected_files(root, terms))
    named = {key for key, _, _ in terms}
    if "fault" not in named:
        recs = [r for r in recs if r.provenance.fault is None]
    if "probe" not in named:
        recs = [r for r in recs if r.provenance.probe]
    if "overlap" not in named:
        recs = [r for r in recs if not r.overlap_starts]
    for key, negate, value in sorted(terms, key=lambda t: t[0] == "run"):  # run=-N counts within the rest
        if key == "run" and value.startswith("-") and value[1:].isdigit():
            value = newest_run(recs, int(value[1:]), spec)
        values = set(value.split("|"))  # FIELD=A|B: either
        recs = [r for r in recs if (str(SELECT_FIELDS[key](r)) in values) != negate]
    return recs


def parse_terms(spec: str) -> list[tuple[str, bool, str]]:
    """A FIELD=VALUE[,FIELD!=VALUE...] selection's terms: (FIELD, negated, VALUE)."""
    terms = []
    for term in spec.split(","):
        key, sep, value = term.partition("=")
        if not sep or key.rstrip("!") not in SELECT_FIELDS:
            raise SpecwatchInputError(
                None, f"not a results file or FIELD=VALUE with FIELD in {sorted(SELECT_FIELDS)}", field=spec
            )
        terms.append((key.rstrip("!"), key.endswith("!"), value))
    return terms


FILE_FIELDS = ("machine", "sglang_version", "suite", "fault", "probe")
"""Selection fields a results file's place in the store fixes for every record in it
(``jsonl.record_path``: ``<machine>/sglang-<version>/<suite>[+fault-F][+bare].jsonl``)."""


def file_fields(path: Path, root: Path) -> Optional[dict[str, set[str]]]:
    """FIELD -> the values (as ``SELECT_FIELDS`` gives them) every record of ``path`` has by its
    place under ``root``; None for a file outside that layout or with an ambiguous name (a suite
    or fault name holding ``+``): such a file is read whole."""
    try:
        machine, version_dir, name = Path(path).relative_to(root).parts
    except ValueError:
        return None
    if not version_dir.startswith("sglang-") or not name.endswith(".jsonl"):
        return None
    parts = name[: -len(".jsonl")].split("+")
    probe = "on"
    if parts[-1] == "bare" and len(parts) > 1:
        probe, parts = "off", parts[:-1]
    fault = "none"
    if len(parts) == 2 and parts[1].startswith("fault-"):
        fault, parts = parts[1][len("fault-") :], parts[:1]
    if len(parts) != 1 or not parts[0]:
        return None
    version = version_dir[len("sglang-") :]
    return {
        "machine": {machine},
        "sglang_version": {"None", "none"} if version == "none" else {version},
        "suite": {parts[0]},
        "fault": {fault},
        "probe": {probe},
    }


def selected_files(root: Path, terms: list[tuple[str, bool, str]]) -> list[Path]:
    """The results files under ``root`` that can hold a record the selection ``terms`` (FIELD,
    negated, VALUE) keeps: a file whose place rules every record of it out (``file_fields``) is not
    read, nor are fault and bare files unless a term names ``fault`` or ``probe``."""
    named = {key for key, _, _ in terms}
    out = []
    for p in result_files(root):
        fields = file_fields(p, root)
        if fields is not None and not _may_match(fields, terms, named):
            continue
        out.append(p)
    return out


def _may_match(fields: dict[str, set[str]], terms: list[tuple[str, bool, str]], named: set[str]) -> bool:
    if "fault" not in named and "none" not in fields["fault"]:
        return False
    if "probe" not in named and "on" not in fields["probe"]:
        return False
    for key, negate, value in terms:
        if key in FILE_FIELDS:
            hit = bool(fields[key] & set(value.split("|")))
            if hit == negate and len(fields[key]) == 1:
                return False
    return True
