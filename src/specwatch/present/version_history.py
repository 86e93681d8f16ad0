"""The data of the across-versions panels: which machine they read, the version axis, the latest
record of each common case per version, and the lines those cases draw (``plots.across_versions``
draws them)."""

from __future__ import annotations

from typing import Optional

import pandas as pd

from specwatch.core.sglang_host import version_key
from specwatch.store.frame import latest_rows

VERSION_METRICS = (
    ("output_throughput", "tokens/s"),
    ("accept_length", "tokens/verify"),
    ("req_to_token_bytes", "bytes"),
)


def version_axis(df: pd.DataFrame) -> tuple[list, list[str], list[str]]:
    """The across-versions x axis: every SGLang version with a record (in version order), its tick
    label, and the cases ok on every version that has an ok case. A version with no ok case keeps
    its place, labelled with its latest statuses (e.g. '0.5.15 / no ok case: 12 crashed'), so a
    version that could not run never silently drops out of the trend."""
    if df.empty:
        return [], [], []
    ok = df[df.status == "ok"]
    versions = sorted(df.sglang_version.dropna().unique(), key=version_key)
    with_ok = [v for v in versions if (ok.sglang_version == v).any()]
    per_version = [set(ok.case_id[ok.sglang_version == v].unique().tolist()) for v in with_ok]
    common = sorted(set.intersection(*per_version)) if per_version else []
    labels = []
    for v in versions:
        if v in with_ok:
            labels.append(str(v))
        else:
            counts = latest_rows(df[df.sglang_version == v], ["case_id"]).status.value_counts()
            labels.append(f"{v}\nno ok case:\n" + ", ".join(f"{n} {st}" for st, n in counts.items()))
    return versions, labels, common


TIMED_METRICS = {"output_throughput", "decode_throughput", "step_time"}
"""Metrics measured by the clock: across versions they come from ``timing_records`` only."""


def version_machine(df: pd.DataFrame) -> Optional[str]:
    """The machine the across-versions panels read: the one with ok records on the most SGLang
    versions (then the most records, then its name), so a case measured on another host never
    stands in for a release's value (a host change would read as a change of SGLang). None where
    the frame names no machine."""
    if "machine" not in df or df.machine.dropna().empty:
        return None
    ok = df[df.status == "ok"] if "status" in df else df
    ok = ok if not ok.empty else df
    ranks = ok.groupby("machine").agg(versions=("sglang_version", "nunique"), rows=("sglang_version", "size"))
    ranks = ranks.reset_index().sort_values(["versions", "rows", "machine"], ascending=[False, False, True])
    return str(ranks.machine.iloc[0])


def version_lines(df: pd.DataFrame, metric: str) -> tuple[list, list[str], list[str], pd.DataFrame]:
    """One across-versions panel's data: ``version_axis`` over the clean records (no fault run) of
    ``version_machine``'s host that may show ``metric`` (a timed one: not overlapped runs,
    ``timing_records``; an exact one: every run, since overlapped starts leave acceptance and memory
    as they are), and the latest record of each common case per version."""
    keep = df.fault.isna() if "fault" in df else pd.Series(True, index=df.index)
    machine = version_machine(df)
    if machine is not None:
        keep &= df.machine == machine
    if metric in TIMED_METRICS and "overlap_starts" in df:
        keep &= df.overlap_starts != True  # noqa: E712 (timing_records' rows, cut by the same mask: one copy)
    frame = df[keep]
    versions, labels, common = version_axis(frame)
    latest = (
        latest_rows(frame[(frame.status == "ok") & frame.case_id.isin(common)], ["case_id", "sglang_version"])
        if common
        else frame.iloc[0:0]
    )
    return versions, labels, common, latest


CASE_NAME_FIELDS = ("model", "attention_backend", "page_size", "topk", "batch_size")
"""The case parameters an across-versions line is named by (``case_name``)."""


def case_name(first) -> str:
    """An across-versions line's legend name: the case's model, backend, page, topk and batch."""
    return f"{first.model} {first.attention_backend} p{first.page_size} k{first.topk} bs{first.batch_size}"


def ranked_trajectories(values: pd.DataFrame, names: pd.Series) -> list[tuple[list, str, int]]:
    """The distinct lines of a (case x version) panel, most relevant first: cases whose values are
    equal on every version share one line, named after its first case with "(+N same)"; relevance
    is the line's relative range over the versions ((max - min) / |median|), then its case count.
    Returns (values, name, cases) per line."""
    groups: dict[tuple, list[str]] = {}
    for case_id, row in zip(values.index, values.itertuples(index=False)):
        groups.setdefault(tuple(None if pd.isna(v) else v for v in row), []).append(case_id)
    ranked = []
    for line, ids in groups.items():
        seen = pd.Series([v for v in line if v is not None], dtype=float)
        spread = float((seen.max() - seen.min()) / abs(seen.median())) if len(seen) and seen.median() else 0.0
        name = names[ids[0]] + (f" (+{len(ids) - 1} same)" if len(ids) > 1 else "")
        ranked.append((-spread, -len(ids), name, [float("nan") if v is None else v for v in line], len(ids)))
    ranked.sort(key=lambda r: r[:3])
    return [(line, name, n) for _, _, name, line, n in ranked]
