"""The release verdict: the newest SGLang release in the store against the previous one, per suite
both ran (``compare_records`` under the noise budgets, as ``specwatch compare`` reports it), and the
newest release's health per suite (latest record of each case)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import numpy as np
from pydantic import BaseModel, Field

if TYPE_CHECKING:
    import pandas as pd

from specwatch.analysis.compare import ORDER, Row, Verdict, frame_rows
from specwatch.core.errors import SpecwatchInputError
from specwatch.core.record import CaseRecord, Status
from specwatch.core.sglang_host import version_key
from specwatch.store.jsonl import result_files
from specwatch.store.latest import LATEST_COLUMNS, latest_rows
from specwatch.store.select import latest_by_case
from specwatch.store.select_frame import select_rows

BUDGETS_FILE = Path("noise-budgets.json")
"""The noise-budget file ``specwatch noise`` writes, relative to the results root."""


class SuiteComparison(BaseModel):
    """One suite that both releases ran: the comparison ``specwatch compare`` makes of it."""

    suite: str
    """Suite name (``suites/<suite>.toml``)."""
    base: str
    """The base selection, as ``specwatch compare`` takes it (``sglang_version=...,suite=...``)."""
    head: str
    """The head selection, same form."""
    counts: dict[str, int] = Field(default_factory=dict)
    """Rows of the comparison per verdict (``Verdict`` value -> count); verdicts with no row are absent."""
    regressed: list[str] = Field(default_factory=list)
    """``case label: metric`` of each regressed row (timed metrics past their budget, exact metrics, checks)."""
    now_failing: list[str] = Field(default_factory=list)
    """``case label: status`` of each case ok on the base and not ok on the head."""

    def count(self, verdict: Verdict) -> int:
        """Rows with that verdict."""
        return self.counts.get(verdict.value, 0)


class SuiteHealth(BaseModel):
    """One suite of the newest release: the latest record of each case it ran."""

    suite: str
    """Suite name."""
    statuses: dict[str, int] = Field(default_factory=dict)
    """``Status`` value -> number of cases whose latest record ended so (every status present, 0 when none)."""
    failing_checks: dict[str, int] = Field(default_factory=dict)
    """Check name -> ok cases whose latest record fails it."""

    @property
    def cases(self) -> int:
        """Cases with a record."""
        return sum(self.statuses.values())

    @property
    def healthy(self) -> bool:
        """True when no case crashed, failed or timed out and no ok case fails a check (skips are the
        validity rules' and the host's, not the suite's)."""
        bad = sum(n for st, n in self.statuses.items() if st not in (Status.ok.value, Status.skipped.value))
        return bad == 0 and not self.failing_checks


class ReleaseVerdict(BaseModel):
    """The answer the dashboard opens with: did the newest release regress against the previous one?"""

    head_version: str
    """The newest SGLang release with a record."""
    base_version: Optional[str]
    """The release before it with a record; None when the store holds one release only."""
    budgets: Optional[str]
    """The noise-budget file the timed comparisons used; None: the plain 5% threshold."""
    compared: list[SuiteComparison] = Field(default_factory=list)
    """Suites both releases ran, by name."""
    health: list[SuiteHealth] = Field(default_factory=list)
    """Every suite the newest release ran, by name."""

    def total(self, verdict: Verdict) -> int:
        """Rows with that verdict over the compared suites."""
        return sum(c.count(verdict) for c in self.compared)

    @property
    def regressions(self) -> int:
        """Regressed rows over the compared suites."""
        return self.total(Verdict.regressed)

    @property
    def improvements(self) -> int:
        """Improved rows over the compared suites."""
        return self.total(Verdict.improved)

    @property
    def new_failures(self) -> int:
        """Cases ok on the base release and not ok on the newest."""
        return self.total(Verdict.now_failing)

    @property
    def failing_checks(self) -> int:
        """(case, check) pairs failing in the newest release's latest ok records, over every suite."""
        return sum(sum(h.failing_checks.values()) for h in self.health)

    @property
    def passed(self) -> bool:
        """No regression and no new failure between the two releases."""
        return self.regressions == 0 and self.new_failures == 0


def load_budgets(path: Path) -> Optional[dict[str, float]]:
    """The budgets of a noise-budget file (CLASS[/METRIC] -> relative change); None when it does not exist."""
    if not path.exists():
        return None
    try:
        return {str(k): float(v) for k, v in json.loads(path.read_text())["budgets"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise SpecwatchInputError(path, f"not a noise-budget file ({type(e).__name__}: {e})", field="budgets") from e


def suite_health(suite: str, records: list[CaseRecord]) -> SuiteHealth:
    """A suite's health from its records (the latest of each case counts)."""
    latest = latest_by_case(records).values()
    statuses = Counter(r.status.value for r in latest)
    checks = Counter(name for r in latest if r.status is Status.ok for name, ok in r.checks.items() if ok is False)
    return SuiteHealth(
        suite=suite,
        statuses={s.value: statuses.get(s.value, 0) for s in Status},
        failing_checks=dict(sorted(checks.items())),
    )


def compare_suite(
    suite: str, base_version: str, head_version: str, root: Path, budgets: Optional[dict[str, float]]
) -> SuiteComparison:
    """One suite's comparison between two releases, on the selections ``scripts/reports.sh`` names.
    A release whose only runs of the suite overlapped engine starts is compared on those
    (``overlap=on``, as the selection then says): an empty side would compare as no change."""
    sides = []
    for version in (base_version, head_version):
        spec = f"sglang_version={version},suite={suite}"
        rows = select_rows(spec, root)
        if rows.empty:
            spec += ",overlap=on"
            rows = select_rows(spec, root)
        sides.append((spec, rows))
    (base, base_rows), (head, head_rows) = sides
    # counted as they come, only the regressed and now-failing rows kept (in compare's order)
    counts: Counter = Counter()
    kept: list[Row] = []
    for r in frame_rows(base_rows, head_rows, budgets=budgets):
        counts[r.verdict] += 1
        if r.verdict in (Verdict.regressed, Verdict.now_failing):
            kept.append(r)
    kept.sort(key=lambda r: (r.case_id, r.metric))
    return SuiteComparison(
        suite=suite,
        base=base,
        head=head,
        counts={v.value: counts[v] for v in sorted(counts, key=lambda v: ORDER[v])},
        regressed=[f"{r.label}: {r.metric}" for r in kept if r.verdict is Verdict.regressed],
        now_failing=[f"{r.label}: {r.note}" for r in kept if r.verdict is Verdict.now_failing],
    )


def frame_health(suite: str, df: "pd.DataFrame") -> SuiteHealth:
    """``suite_health`` from a records frame's rows of one suite (``latest_rows``: the same rule)."""
    latest = latest_rows(df, ["case_id"])
    statuses = Counter(latest.status)
    ok = latest[latest.status == Status.ok.value]
    checks = Counter()
    for col in (c for c in ok.columns if c.startswith("check.")):
        if n := int(sum(v is False or v is np.False_ for v in ok[col])):
            checks[col[len("check.") :]] = n
    return SuiteHealth(
        suite=suite,
        statuses={s.value: statuses.get(s.value, 0) for s in Status},
        failing_checks=dict(sorted(checks.items())),
    )


def release_verdict(
    root: Path, budgets_path: Optional[Path] = None, frame: Optional["pd.DataFrame"] = None
) -> Optional[ReleaseVerdict]:
    """The newest release against the previous one in the results store at ``root`` (clean, probed
    records, as ``specwatch compare`` selects them); None when the store holds no such record.
    ``budgets_path``: the noise budgets (default ``<root>/noise-budgets.json``, used when present);
    ``frame``: the store's records frame (``files_frame``; read when not given). Versions and
    health come from the frame; each compared suite reads only its two releases' files (``select``)."""
    from specwatch.store.frame import files_frame

    budgets_path = root / BUDGETS_FILE if budgets_path is None else budgets_path
    budgets = load_budgets(budgets_path)
    found = newest_two(files_frame(result_files(root)) if frame is None else frame)
    if found is None:
        return None
    df, head, base = found
    suites = {v: set(df.suite[df.sglang_version == v].unique().tolist()) for v in (head, base)}
    compared = (
        [compare_suite(s, base, head, root, budgets) for s in sorted(suites[head] & suites[base])] if base else []
    )
    newest = df[df.sglang_version == head]
    health = [frame_health(s, newest[newest.suite == s]) for s in sorted(suites[head])]
    return ReleaseVerdict(
        head_version=head,
        base_version=base,
        budgets=str(budgets_path) if budgets else None,
        compared=compared,
        health=health,
    )


def newest_two(df: "pd.DataFrame") -> Optional[tuple["pd.DataFrame", str, Optional[str]]]:
    """(the clean, probed records of a records frame cut to what the verdict's health reads, the
    newest release among them, the one before it or None); None: no such record."""
    if df.empty or "sglang_version" not in df:
        return None
    # statuses and checks of overlapped runs count (only their timing is contended, and compare's
    # own selections leave those out of the timed comparison)
    clean = df.fault.isna() & (df.probe == True) & df.sglang_version.notna() & (df.sglang_version != "")  # noqa: E712
    read = ["sglang_version", "suite", "case_id", *LATEST_COLUMNS, *(c for c in df.columns if c.startswith("check."))]
    df = df.loc[clean, [c for c in dict.fromkeys(read) if c in df]]  # only what the health reads, cut once
    versions = sorted(set(df.sglang_version.unique().tolist()), key=version_key)
    if not versions:
        return None
    return df, versions[-1], (versions[-2] if len(versions) > 1 else None)


def verdict_reads(root: Path, frame: "pd.DataFrame", budgets_path: Optional[Path] = None) -> object:
    """All ``release_verdict(root, budgets_path, frame)`` reads: the records of the newest two
    releases its health reads (``newest_two``) and the file-system stamps
    (``result_cache.file_stamps``) of the budget file and of every results file a selection of
    either release reads (``select.selected_files``: its comparisons' records)."""
    from specwatch.store.result_cache import file_stamps
    from specwatch.store.select import parse_terms, selected_files

    budgets_path = root / BUDGETS_FILE if budgets_path is None else budgets_path
    found = newest_two(frame)
    if found is None:
        return None
    df, head, base = found
    versions = [v for v in (base, head) if v is not None]
    try:
        files = selected_files(root, parse_terms(f"sglang_version={'|'.join(versions)}"))
    except SpecwatchInputError:  # a version no selection can name: every file
        files = result_files(root)
    budgets = file_stamps([budgets_path]) if budgets_path.exists() else None
    return df[df.sglang_version.isin(versions)], head, base, str(budgets_path), budgets, file_stamps(files)
