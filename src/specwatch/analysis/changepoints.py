"""Change points over SGLang releases: per machine, case and metric, the steps asv's step detector
(``asv.step_detect.detect_steps``, a Potts-model fit of a piecewise-constant series) finds in the
metric's history, releases in version order.

Each release contributes its latest clean record of the case (no fault, with the probe): every
repeat's sample in run order (its value where it kept none), so the detector sees the within-release
noise. A step is reported where two fitted segments meet between two releases (a boundary inside one
release's repeats is noise of that run) and the segments' values differ by more than ``threshold``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Iterable, Optional

import pandas as pd
from packaging.version import InvalidVersion, Version

from specwatch.store.frame import COMPARE_COLUMN
from specwatch.store.latest import latest_rows

THRESHOLD = 0.05
"""Relative size below which a detected step is not reported."""

COLUMNS = [
    "status",
    "sglang_version",
    "machine",
    "case_id",
    "fault",
    "probe",
    "started_at",
    "finished_at",
    "run_id",
    "host_interference",
    COMPARE_COLUMN,
]
"""The files-frame columns ``changepoints`` reads (``COMPARE_COLUMN``: each metric's samples)."""

DASHBOARD_METRICS = ["decode_throughput", "step_time", "accept_length", "req_to_token_bytes", "speedup"]
"""The metrics the dashboard's change-point table covers (``specwatch changepoints``: any)."""


@dataclass(frozen=True)
class Step:
    """One step of a metric's history between two consecutive measured releases."""

    before_release: str
    """The last release of the segment before the step."""
    release: str
    """The first release of the segment after it."""
    before: float
    """The fitted value before (asv: the segment's average)."""
    after: float
    """The fitted value after."""

    @property
    def change(self) -> float:
        return self.after / self.before - 1.0 if self.before else float("inf")


@lru_cache(maxsize=None)
def _version_key(v: str):
    try:
        return (0, Version(v))
    except InvalidVersion:
        return (1, v)


def release_steps(history: list[tuple[str, list[float]]], threshold: float = THRESHOLD) -> list[Step]:
    """The steps of one metric's history (release, its samples), releases in version order."""
    from asv.step_detect import detect_steps

    y, owner = [], []
    for i, (_, samples) in enumerate(history):
        y += samples
        owner += [i] * len(samples)
    if len(history) < 2 or len(y) < 2:
        return []
    lo, hi = min(y), max(y)
    if lo > 0 and hi / lo - 1.0 <= threshold:
        return []  # segment values lie within [lo, hi]: no step can exceed the threshold
    segments = detect_steps(y)
    out = []
    for left, right in zip(segments, segments[1:]):
        at = right[0]
        if at == 0 or owner[at] == owner[at - 1]:
            continue  # the boundary falls inside one release's repeats
        step = Step(history[owner[at - 1]][0], history[owner[at]][0], left[2], right[2])
        if abs(step.change) > threshold:
            out.append(step)
    return out


def _samples(cell: dict, metric: str) -> Optional[list[float]]:
    m = cell["m"].get(metric)
    if m is None or m[0] is None:
        return None
    vals = m[2]  # the decoded cell's own list, not copied: nothing changes it
    if vals and None in vals:
        vals = [x for x in vals if x is not None]
    return vals or [m[0]]


KEY = ["machine", "case_id", "sglang_version"]
"""A series' point: each case's latest clean record per machine and release."""

CELL = "_cell"
"""The picked rows' column: each record's case label (``l``) and per metric kept its samples (``s``:
name -> ``_samples``, None where the metric holds no value)."""


def picked_rows(df: pd.DataFrame, metrics: Optional[list[str]] = None) -> pd.DataFrame:
    """The latest clean row (``KEY``) of each case and release of a files frame read with
    ``COMPARE_COLUMN``, with ``CELL``: its label and ``metrics``' samples (all when None). The rows
    are picked on the small columns; only the picked rows' cells are decoded."""
    if df.empty or COMPARE_COLUMN not in df:
        return pd.DataFrame()
    latest = latest_clean(df.drop(columns=[COMPARE_COLUMN]))
    if latest.empty:
        return latest
    raw = df.loc[latest.index, COMPARE_COLUMN].tolist()  # one take: not an Arrow lookup per row
    return latest.assign(**{CELL: decoded(raw, metrics)})


def latest_clean(df: pd.DataFrame) -> pd.DataFrame:
    """The latest clean row (``KEY``: ok, no fault, probed) of each case and release of a files
    frame, its index kept (the rows' positions in the frame read)."""
    need = {"status", "sglang_version", "machine", "case_id"}
    if df.empty or not need <= set(df.columns):
        return pd.DataFrame()
    keep = (df.status == "ok") & df.sglang_version.notna()
    if "fault" in df:
        keep &= df.fault.isna()
    if "probe" in df:
        keep &= df.probe != False  # noqa: E712
    return latest_rows(df[keep], KEY)


def decoded(raw: list, metrics: Optional[list[str]]) -> list[dict]:
    """``CELL`` of each compare cell in ``raw`` (JSON text): its label and ``metrics``' samples."""
    import orjson

    cells = []
    for text in raw:
        c = orjson.loads(text)
        names = c["m"] if metrics is None else [n for n in metrics if n in c["m"]]
        cells.append({"l": c["l"], "s": {n: _samples(c, n) for n in names}})
    return cells


def file_picks(path: Path, metrics: Optional[list[str]], raw: bool = False) -> pd.DataFrame:
    """``picked_rows`` of one results file, from its picks cache (``picks_cache``) while the file
    is unchanged; else picked (``_file_picks``) and cached. ``raw``: the cells as JSON text."""
    from specwatch.analysis.picks_cache import cached_picks

    return cached_picks(path, metrics, CELL, lambda: _file_picks(path, metrics), raw)


def _file_picks(path: Path, metrics: Optional[list[str]]) -> pd.DataFrame:
    """``picked_rows`` of one results file, its compare cells taken only for the picked rows from
    the file's Parquet cache (``frame_cache.cached_cells``): the whole column never becomes Python
    strings. Without a usable cache, ``picked_rows`` of the file read whole."""
    from specwatch.store.frame import files_frame
    from specwatch.store.frame_cache import cached_cells

    small = files_frame([path], columns=[c for c in COLUMNS if c != COMPARE_COLUMN]).reset_index(drop=True)
    latest = latest_clean(small)  # its index: the rows' positions in the file's cache
    if latest.empty:
        return latest
    raw = cached_cells(path, COMPARE_COLUMN, latest.index.tolist(), len(small))
    if raw is None:
        return picked_rows(files_frame([path], columns=COLUMNS), metrics)
    return latest.assign(**{CELL: decoded(raw, metrics)})


def store_changepoints(
    paths: Iterable[Path], metrics: Optional[list[str]] = None, threshold: float = THRESHOLD
) -> pd.DataFrame:
    """``changepoints`` of the results files ``paths``, read one file at a time: each file's picked
    rows (``picked_rows``) kept, the rest of its frame dropped before the next is read. The latest
    of the files' picks is the latest of their records (ties: the later file's, as read in order)."""
    return picks_changepoints(store_picks(paths, metrics), metrics, threshold)


def store_picks(paths: Iterable[Path], metrics: Optional[list[str]] = None, raw: bool = False) -> pd.DataFrame:
    """The latest of the files' picked rows (``file_picks``: all ``store_changepoints`` reads of
    them); empty where no file has any. ``raw``: the cells left as JSON text (``history_picks``)."""
    parts = [file_picks(Path(p), metrics, raw) for p in paths]
    parts = [p for p in parts if not p.empty]
    return latest_rows(pd.concat(parts, ignore_index=True, sort=False), KEY) if parts else pd.DataFrame()


def history_picks(picks: pd.DataFrame) -> pd.DataFrame:
    """The picks ``steps_table`` reads: those of a case picked on its machine in two releases or
    more (a case of one release has no step), in their order."""
    if picks.empty:
        return picks
    return picks[picks.groupby(["machine", "case_id"]).sglang_version.transform("size") >= 2]


def picks_changepoints(picks: pd.DataFrame, metrics: Optional[list[str]], threshold: float = THRESHOLD) -> pd.DataFrame:
    """``store_changepoints`` of the picks ``store_picks`` gave."""
    return pd.DataFrame() if picks.empty else steps_table(picks, metrics, threshold)


def changepoints(df: pd.DataFrame, metrics: Optional[list[str]] = None, threshold: float = THRESHOLD) -> pd.DataFrame:
    """One row per step found (``release_steps``) in the clean records of a files frame read with
    ``COMPARE_COLUMN``: machine, case, metric, the two releases, the fitted values and the change.
    ``metrics``: only these (default: every metric a case recorded in two releases or more)."""
    picked = picked_rows(df, metrics)
    return pd.DataFrame() if picked.empty else steps_table(picked, metrics, threshold)


def steps_table(latest: pd.DataFrame, metrics: Optional[list[str]], threshold: float) -> pd.DataFrame:
    """``changepoints``' table from the picked rows (``picked_rows``); a case measured in one
    release only is skipped, and a history seen before (same releases, same samples) reuses its steps."""
    latest = history_picks(latest)
    histories: dict[tuple, list[tuple]] = {}
    for machine, cid, version, cell in zip(latest.machine, latest.case_id, latest.sglang_version, latest[CELL]):
        histories.setdefault((machine, cid), []).append((version, cell))
    found: dict[tuple, list[Step]] = {}
    rows = []
    for (machine, cid), group in sorted(histories.items()):
        cells = sorted(group, key=lambda r: _version_key(r[0]))
        names = metrics or sorted({n for _, c in cells for n in c["s"]})
        for name in names:
            history = [(v, s) for v, c in cells if (s := c["s"].get(name))]
            key = tuple((v, tuple(s)) for v, s in history)
            if key not in found:
                found[key] = release_steps(history, threshold)
            for st in found[key]:
                rows.append(
                    {
                        "machine": machine,
                        "case_id": cid,
                        "case": cells[-1][1]["l"],
                        "metric": name,
                        "from": st.before_release,
                        "to": st.release,
                        "before": st.before,
                        "after": st.after,
                        "change": f"{st.change:+.1%}",
                    }
                )
    return pd.DataFrame(rows)
