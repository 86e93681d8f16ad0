"""The one rule for a case's latest record, for records and for records frames alike.

A record that measured the host rather than the case (``rules.crashlog.host_interference``: e.g. a
lost rendezvous port, ``EADDRINUSE``) is a case's latest only where the case has no measured
record; otherwise the latest is the newest by finished time. Ties are broken by start time, then
run id, then status, then the order the records were read in (files sorted, lines in order), so
the same store always gives the same answer. ``store.frame.latest_rows``, ``store.select.latest_by_case``
and the asv benchmarks all pick with it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Hashable, Iterable

if TYPE_CHECKING:
    import pandas as pd
from specwatch.core.record import CaseRecord
from specwatch.rules.crashlog import host_interference

ORDER_COLUMNS = ["_measured", "finished_at", "started_at", "_run", "status"]
"""A records frame's columns ``latest_rows`` sorts by (``_``: derived), least significant last."""

LATEST_COLUMNS = ["host_interference", "finished_at", "started_at", "run_id", "status"]
"""The records-frame columns ``latest_rows`` reads besides its groups' (a narrow frame passed to
it keeps these)."""


def latest_key(r: CaseRecord) -> tuple:
    """Sort key of a record under the rule: the largest key of a case is its latest."""
    p = r.provenance
    return (host_interference(r) is None, p.finished_at, p.started_at, p.run_id or "", r.status.value)


def latest_by_case(records: Iterable[CaseRecord]) -> dict[str, CaseRecord]:
    """Each case's latest record (``latest_key``; a resumed sweep may hold several per case)."""
    out: dict[str, CaseRecord] = {}
    keys: dict[str, tuple] = {}
    for r in records:
        k = latest_key(r)
        if r.case_id not in out or k >= keys[r.case_id]:  # later-read wins a full tie
            out[r.case_id], keys[r.case_id] = r, k
    return out


def latest_rows(df: "pd.DataFrame", by: list[Hashable]) -> "pd.DataFrame":
    """The latest row of each ``by`` group of a records frame, whole: unlike
    ``groupby(by).last()``, which takes each column's last non-null value and so can pair a
    crashed record's status with an older record's metrics or output digest."""
    import pandas as pd

    if df.empty:
        return df
    # ordered and picked on the key columns alone; the frame's rows taken once, in that order
    cols = {c: df[c] for c in dict.fromkeys(by)}
    cols["_measured"] = df.host_interference.isna() if "host_interference" in df else pd.Series(True, df.index)
    cols["finished_at"] = df.finished_at if "finished_at" in df else df.started_at
    cols["started_at"], cols["status"] = df.started_at, df.status
    cols["_run"] = df.run_id.fillna("") if "run_id" in df else pd.Series("", df.index)
    keys = pd.DataFrame({k: v.reset_index(drop=True) for k, v in cols.items()})
    picked = keys.sort_values(ORDER_COLUMNS, kind="mergesort").drop_duplicates(list(dict.fromkeys(by)), keep="last")
    return df.iloc[picked.index.to_numpy()]


def record_id(case_id: str, started_at) -> str:
    """A record's id: ``<case_id>@<started_at as YYYYMMDDTHHMMSSZ>`` (UTC), e.g.
    ``40b2d1611def@20261130T155437Z``; ``started_at`` a datetime (or pandas Timestamp), a naive
    one taken as UTC."""
    from datetime import timezone

    ts = started_at if started_at.tzinfo is None else started_at.astimezone(timezone.utc)
    return f"{case_id}@{ts.strftime('%Y%m%dT%H%M%SZ')}"
