"""Whether a compared pair ran as quietly as the A/A pairs its detection floor was measured on.

A floor (``analysis.floor``) is a margin times the largest change seen between A/A runs, and its
held-out false-positive rate holds for runs as noisy as those. A pair timed on a noisier host can
hide a change several times the floor, and its "unchanged" then says nothing. Each timed row
carries the wider of its two sides' ``window_spread``; where that is more than ``NOISIER_FACTOR``
times the widest spread of the floor's A/A runs for the same class and metric, the row is marked
(``Row.noisier``) with the change that could hide at that noise: the floor scaled by the ratio of
the spreads.

On the stored tiny batch-8 records: the clean run of ``20261206T060714Z-bfbb88`` against that of
``20261206T041819Z-e480fb`` reads a decode-throughput window spread of 45% against at most 5% in
the floor's A/A runs (``20261206T021311Z-d11376``): 9 of its 10 checked timed metrics are marked
(the 90th-percentile SGLang step time, 18% wide in the A/A runs, is not).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterable, Optional

from specwatch.analysis.compare import Row, noise_class
from specwatch.analysis.floor import DetectionFloor
from specwatch.analysis.window_spread import window_spread
from specwatch.store.step_state import probed_slow_shares, shares_text

NOISIER_FACTOR = 2.0
"""How many times the floor's A/A window spread a compared pair's may reach before the floor no
longer covers its rows."""

QUIET_SPREAD = 0.01
"""A window spread the check never calls noisy (``NOISIER_FACTOR`` times this at least): 8b's A/A
runs spread 0.2-1.2%, where twice the widest is still quiet."""


def hidden_change(spread: float, calm: float, floor: float, scaled: Optional[float] = None) -> Optional[float]:
    """The change that could hide in a run of window spread ``spread``, whose A/A runs spread
    ``calm``: the budget ``scaled`` to that spread where the row has one (``DetectionFloor.budget_at``:
    the verdict applied it), else ``floor`` scaled by the ratio of the spreads; None where the run
    is within ``NOISIER_FACTOR`` times the A/A spread (or ``QUIET_SPREAD``, the larger)."""
    calm = max(calm, QUIET_SPREAD)
    if spread <= NOISIER_FACTOR * calm:
        return None
    return scaled if scaled is not None else floor * spread / calm


def _hidden(floor: DetectionFloor, klass: str, metric: str, spread: float, calm: float) -> Optional[float]:
    """``hidden_change`` of a row of ``klass`` and ``metric`` under ``floor``."""
    scaled = floor.budget_at(klass, metric, spread) if floor.scales(klass, metric, spread) else None
    return hidden_change(spread, calm, floor.floor(klass, metric), scaled)


def mark_noisier(rows: Iterable[Row], floor: DetectionFloor) -> list[Row]:
    """Mark every timed row noisier than ``floor``'s A/A runs (``Row.noisier``, also appended to
    its note) and return the marked rows. A class and metric the floor has no spread for (no A/A
    pair measured it, or too few windows) is not checked."""
    marked = []
    for r in rows:
        calm = floor.spreads.get(f"{r.noise_class}/{r.metric}")
        if not r.timed or r.spread is None or calm is None:
            continue
        if (hidden := _hidden(floor, r.noise_class, r.metric, r.spread, calm)) is None:
            continue
        r.noisier = (
            f"window spread {r.spread:.0%} against <= {calm:.1%} in the floor's A/A runs: "
            f"a change up to about {hidden:.0%} can hide"
        )
        r.note = "; ".join(x for x in (r.note, r.noisier) if x)
        marked.append(r)
    return marked


def noise_lines(rows: list[Row], floor: DetectionFloor) -> list[str]:
    """The report's lines on the check (after ``mark_noisier``): how many timed rows ran noisier
    than the floor's A/A runs, per class with the widest spread against the A/A one; a line saying
    all were within it where none was; nothing where the floor has no spreads."""
    checked = [r for r in rows if r.timed and r.spread is not None and f"{r.noise_class}/{r.metric}" in floor.spreads]
    if not checked:
        return []
    noisy = [r for r in checked if r.noisier]
    if not noisy:
        return [
            f"Noise check: all {len(checked)} checked timed metrics ran within {NOISIER_FACTOR:g}x the window "
            "spread of the floor's A/A runs: the floor applies at this noise.",
            "",
        ]
    by_class: dict[str, tuple[float, float]] = {}
    for r in noisy:
        calm = floor.spreads[f"{r.noise_class}/{r.metric}"]
        widest, _ = by_class.get(r.noise_class, (0.0, 0.0))
        if r.spread > widest:
            by_class[r.noise_class] = (r.spread, calm)
    classes = "; ".join(f"{k}: up to {s:.0%} against <= {c:.1%}" for k, (s, c) in sorted(by_class.items()))
    return [
        f"**Noise check: {len(noisy)} of {len(checked)} checked timed metrics ran noisier than the floor's A/A "
        f"runs** (window spread over {NOISIER_FACTOR:g}x theirs; {classes}). Their class's A/A runs never ran "
        "this noisily: where a budget is scaled to the row's spread it extrapolates the A/A change per unit "
        "of spread, elsewhere the verdict rests on the test alone, and an unchanged row can hide a change "
        "above the floor (each row's note says how large). Rerun them on a quieter host.",
        "",
    ]


def record_noise(rec, floor: DetectionFloor, metric: str = "decode_throughput") -> Optional[str]:
    """One line where an ok record (``CaseRecord``) timed ``metric`` noisier than ``floor``'s A/A
    runs of its class (the run's own check, before any comparison: ``specwatch run`` prints it as
    the record lands), with the change that could hide; None where it did not, or cannot be told
    (not ok, too few windows, no A/A spread for the class)."""
    m = rec.metrics.get(metric) if rec.status.value == "ok" else None
    klass = noise_class(rec.case)
    calm = floor.spreads.get(f"{klass}/{metric}")
    if m is None or calm is None or (spread := window_spread(m)) is None:
        return None
    if (hidden := _hidden(floor, klass, metric, spread, calm)) is None:
        return None
    shares = probed_slow_shares(rec.details)
    slow = f"; SGLang's decode steps ran slow {shares_text(shares)} (store.step_state)" if shares else ""
    return (
        f"noisy host: {metric} windows spread {spread:.0%} against <= {calm:.1%} in the A/A runs of {klass} "
        f"({Path(floor.source or '').name}): a change up to about {hidden:.0%} can hide in this record{slow}"
    )


def store_noise_check(root: Path, suites: Iterable[str] = ()) -> Callable[[object], Optional[str]]:
    """``record_noise`` of a record against the floor its suite's comparisons read under the store
    ``root`` (``floor.budget_file_for``), each suite's floor found once: those of ``suites`` at once
    (before a run's first engine starts, so no floor is computed beside a timed window), any other
    at its first record. A store whose budget file cannot be read gives no line (the run goes on)."""
    from specwatch.analysis.floor import budget_file_for, file_threshold, store_floor
    from specwatch.core.errors import SpecwatchInputError

    floors: dict[str, Optional[DetectionFloor]] = {}

    def floor_of(suite: str) -> Optional[DetectionFloor]:
        if suite not in floors:
            source = budget_file_for(root, [f"suite={suite}"])
            try:
                floors[suite] = store_floor(root, source, file_threshold(source))
            except (SpecwatchInputError, OSError, ValueError):
                floors[suite] = None
        return floors[suite]

    for suite in suites:
        floor_of(suite)

    def check(rec) -> Optional[str]:
        floor = floor_of(rec.suite)
        return None if floor is None else record_noise(rec, floor)

    return check
