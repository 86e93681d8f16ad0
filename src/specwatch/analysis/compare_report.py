"""The ``compare`` report as markdown: verdict counts, the detection floor's lines, one table of
what moved, and folded sections for coverage the head added, for changes below the floor and for
unchanged metrics that ran noisier than the floor's A/A runs (``analysis.pair_noise``)."""

from __future__ import annotations

from typing import Iterable, Optional

from specwatch.analysis.compare import BAD, ORDER, Row, Verdict
from specwatch.analysis.engine_test import TimedTest
from specwatch.core.record import Status


def _fmt(v: Optional[float]) -> str:
    if v is None:
        return "–"
    return f"{v:.4g}" if abs(v) < 1e6 else f"{v:.4e}"


def markdown(
    rows: list[Row], base_name: str, head_name: str, show_unchanged: bool = False, header: Iterable[str] = ()
) -> str:
    """The report; ``header``: lines after the verdict counts (the detection floor, ``analysis.floor``)."""
    counts: dict[Verdict, int] = {}
    for r in rows:
        counts[r.verdict] = counts.get(r.verdict, 0) + 1
    summary = ", ".join(f"{n} {v.value}" for v, n in sorted(counts.items(), key=lambda kv: ORDER[kv[0]]))
    lines = [f"## specwatch: `{head_name}` vs `{base_name}`", "", summary or "no cases", "", *header]
    if engines := sum(r.test is TimedTest.engine_medians for r in rows):
        repeats = sum(r.test is TimedTest.repeats for r in rows)
        lines += [
            f"Timed metrics tested on engine medians (Welch t, both sides with >= 2 engine starts): {engines}; "
            f"on repeats (Mann-Whitney U): {repeats}.",
            "",
        ]
    if paired := sum(r.test is TimedTest.paired_rounds for r in rows):
        lines += [
            f"Timed metrics tested round by round (paired t on engine-median ratios, passes interleaved in one "
            f"run): {paired}.",
            "",
        ]
    shown = [r for r in rows if show_unchanged or r.verdict is not Verdict.unchanged]
    folded = [r for r in shown if _is_benign_new(r)]
    if main := [r for r in shown if not _is_benign_new(r)]:
        lines += _table(main)
    if folded:  # coverage added by the head (a sweep that grew): listed, but out of the reviewer's way
        cases = sum(r.metric == "status" for r in folded)
        what = f"{cases} case(s) only in head, healthy; {len(folded) - cases} metric(s) the base did not record"
        lines += ["", f"<details><summary>{what}</summary>", ""]
        lines += _table(folded) + ["", "</details>"]
    listed = {id(r) for r in shown}
    if below := [r for r in rows if r.below_floor and id(r) not in listed]:
        what = f"{len(below)} timed change(s) below the floor: the test calls them, the class's floor is larger"
        lines += ["", f"<details><summary>{what}</summary>", ""] + _table(below) + ["", "</details>"]
        listed |= {id(r) for r in below}
    if noisy := [r for r in rows if r.noisier and id(r) not in listed]:  # analysis.pair_noise
        what = f"{len(noisy)} unchanged timed metric(s) that ran noisier than the floor's A/A runs: a change can hide"
        lines += ["", f"<details><summary>{what}</summary>", ""] + _table(noisy) + ["", "</details>"]
    return "\n".join(lines) + "\n"


def _is_benign_new(r: Row) -> bool:
    """A head-only case that is ok or skipped, or a metric the base did not record yet. A head-only
    case that crashed or failed stays in the main table."""
    return r.verdict is Verdict.new and (r.metric != "status" or r.note in (Status.ok.value, Status.skipped.value))


def _table(rows: list[Row]) -> list[str]:
    """The rows as a markdown table; a ``speedup`` column (the head's, over plain decoding) and an
    ``overhead`` column (the head's probed / baseline, ``run --baseline``) where any has one."""
    sp, oh = any(r.speedup is not None for r in rows), any(r.overhead is not None for r in rows)
    out = [
        f"| verdict | case | metric | base | head | ratio |{' speedup |' if sp else ''}{' overhead |' if oh else ''} note |",
        f"|---|---|---|---|---|---|{'---|' if sp else ''}{'---|' if oh else ''}---|",
    ]
    for r in rows:
        ratio = "" if r.ratio is None else f"{r.ratio:.3f}"
        cell = (" " + ("" if r.speedup is None else f"{r.speedup:.2f}x") + " |") if sp else ""
        cell += f" {r.overhead or ''} |" if oh else ""
        out.append(
            f"| {r.verdict.value} | `{r.case_id}` {r.label} | {r.metric} | {_fmt(r.base)} | "
            f"{_fmt(r.head)} {r.unit} | {ratio} |{cell} {r.note} |"
        )
    return out


def has_regression(rows: list[Row]) -> bool:
    return any(r.verdict in BAD for r in rows)
