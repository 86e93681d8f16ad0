"""A probed case's baseline (``specwatch run --baseline``) and the harness overhead it gives.

The baseline is a plain loop of ``sglang.Engine.generate`` on the case's timed prompts, in a
process of its own with nothing of specwatch in SGLang's processes (``worker.baseline``), run
interleaved with the probed engine group (``run.baseline``). The case's record then carries:

* ``baseline_output_throughput``: output tokens/s of the plain loop; samples every timed call of
  every baseline run, ``engine_medians`` each run's median where there were several runs, value
  their median (as the probed ``output_throughput`` is over its engine starts);
* ``overhead`` = probed ``output_throughput`` / ``baseline_output_throughput`` (values; 1: the
  harness costs nothing, 0.95: the probed run is 5% slower); its samples are each probed repeat
  over the baseline value, so their relative spread is the probed run's.

Where the group ran several rounds (``probed0 baseline0 baseline1 probed1 ...``), reports also
pair each probed engine start with the baseline run of its round (``rounds_overhead``): the geometric
mean of the per-round ratios with its 95% t interval, and whether that interval lies at or above
``OVERHEAD_TARGET``, below it, or holds it (the host's noise then hides a 2% cost).

Where both loops recorded SGLang's own step times (the suite's ``step_times``), each round also
reads the overhead on that clock (``step_round_ratios``): the plain loop's fast-state decode step
(``sglang_step_time_p10``) over the probed engine's, the probe's cost inside SGLang's step without
the wall-clock noise of a host whose cores change speed within seconds.

``details.baseline`` keeps every run's timings, the order the runs went in, and why a run failed.
"""

from __future__ import annotations

import copy
import math
import statistics
from dataclasses import dataclass
from enum import Enum
from typing import Optional

from specwatch.core.details import BaselineStep
from specwatch.core.protocol import StopReason
from specwatch.core.record import CaseRecord, Metric

BASELINE_THROUGHPUT = "baseline_output_throughput"
"""Metric: output tokens/s of the plain-loop baseline (higher is better)."""

OVERHEAD = "overhead"
"""Metric: probed output tokens/s over the baseline's (unit ``x``; 1: no harness cost)."""

PROBED_THROUGHPUT = "output_throughput"
"""The probed record's metric the overhead is the ratio of."""

STEP_CLOCK = "sglang_step_time_p10"
"""The step clock's metric (``worker.step_times``): both loops' fast-state decode step, ms."""

OVERHEAD_TARGET = 0.98
"""The overhead the harness may have: the probed run at 98% or more of the plain loop's tokens/s."""

CI_LEVEL = 0.95
"""Confidence of ``RoundsOverhead``'s interval."""


class OverheadVerdict(str, Enum):
    """Where a ``RoundsOverhead`` interval lies against ``OVERHEAD_TARGET``."""

    within = "within"
    """The whole interval at or above the target: the harness costs at most 2%."""
    past = "past"
    """The whole interval below the target: the harness costs more than 2%."""
    unresolved = "unresolved"
    """The interval holds the target: at this host's noise the rounds cannot tell."""


class RoundsKind(str, Enum):
    """How a record's rounds put the probed engine beside the plain loop (``details.baseline.order``)."""

    sequential = "sequential"
    """One after the other on the host (``probed0 baseline0 baseline1 probed1 ...``): a round's two
    windows lie tens of seconds apart."""
    paired = "paired"
    """Both engines up at once, taking turns batch by batch (``paired0 ...``, ``specwatch run
    --paired``): a round's two windows share the host's state within a second or so, each loop
    judging its own windows (the plain loop's end by wall seconds, the probed one's by decode
    seconds, so they drift apart by a batch or two a window)."""
    lockstep = "lockstep"
    """Paired, the plain loop's windows ending with the probed worker's (``core.turns``, the plain
    loop's ``windows_stopped_by`` is ``lead``): both time the same batches of the same stretch."""


def rounds_kind(baseline: Optional[dict]) -> Optional[RoundsKind]:
    """``RoundsKind`` of a record's ``details.baseline`` (None without one): paired where any round
    ran paired, lockstep where one of those followed the probed windows."""
    if not baseline:
        return None
    if not any(BaselineStep.of(o) is BaselineStep.paired for o in baseline.get("order") or []):
        return RoundsKind.sequential
    followed = any(r.get("windows_stopped_by") == StopReason.lead.value for r in baseline.get("runs") or [])
    return RoundsKind.lockstep if followed else RoundsKind.paired


@dataclass(frozen=True)
class RoundsOverhead:
    """The overhead over interleaved rounds: probed engine start k against baseline run k, which ran
    right after it (right before it on odd rounds) on the same host, so a drift of the host between
    rounds hits both sides of a ratio and drops out of it."""

    ratio: float
    """Geometric mean of the per-round ratios (probed engine median / baseline run median)."""
    low: float
    """Lower end of its ``CI_LEVEL`` t interval (on the log ratios, n - 1 degrees of freedom)."""
    high: float
    """Upper end of that interval."""
    rounds: int
    """Rounds paired (at least 2)."""

    @property
    def verdict(self) -> OverheadVerdict:
        if self.low >= OVERHEAD_TARGET:
            return OverheadVerdict.within
        return OverheadVerdict.past if self.high < OVERHEAD_TARGET else OverheadVerdict.unresolved

    def text(self, name: str = "rounds") -> str:
        """``rounds 0.996, 95% CI 0.993-0.999: within 0.98`` (the verdict against the target)."""
        return (
            f"{name} {self.ratio:.3f}, {CI_LEVEL:.0%} CI {self.low:.3f}-{self.high:.3f}: "
            f"{self.verdict.value} {OVERHEAD_TARGET}"
        )


def round_ratios(metrics: dict) -> Optional[list[float]]:
    """Each round's overhead, probed engine median k / baseline run median k, or None: no
    ``overhead``, fewer than two rounds, or not one baseline run per probed engine start (a failed
    run leaves the rounds unpaired)."""
    if OVERHEAD not in metrics:
        return None
    probed, base = metrics.get(PROBED_THROUGHPUT), metrics.get(BASELINE_THROUGHPUT)
    p = list(getattr(probed, "engine_medians", None) or [])
    b = list(getattr(base, "engine_medians", None) or [])
    if len(p) < 2 or len(p) != len(b) or min(p + b) <= 0:
        return None
    return [x / y for x, y in zip(p, b)]


def overhead_by_rounds(metrics: dict, metric):
    """A record's ``overhead`` metric (``Metric``-like) with its per-round ratios as its
    ``engine_medians`` where its rounds pair: compare then tests two records' overheads round by
    round, not over probed repeats divided by one baseline value (a drifting host moves those
    together with the baseline). ``metric`` itself where the rounds do not pair or it has them."""
    ratios = round_ratios(metrics)
    if ratios is None or getattr(metric, "engine_medians", None):
        return metric
    out = copy.copy(metric)
    out.engine_medians = ratios
    return out


def record_round_ratios(metrics: dict, baseline: Optional[dict] = None) -> Optional[list[float]]:
    """The rounds a record's own interval is over: its full-prefill rounds where its
    ``details.baseline`` is given (``prefilled_round_ratios``, the rounds ``analysis.overhead``
    pools), every paired round of its metrics alone otherwise (``round_ratios``)."""
    return prefilled_round_ratios(metrics, baseline) if baseline is not None else round_ratios(metrics)


def rounds_overhead(metrics: dict, baseline: Optional[dict] = None) -> Optional[RoundsOverhead]:
    """``RoundsOverhead`` of a record over ``record_round_ratios``; None with fewer than two rounds."""
    ratios = record_round_ratios(metrics, baseline)
    if ratios is None:
        return None
    return rounds_interval(ratios)


def rounds_interval(ratios: list[float]) -> Optional[RoundsOverhead]:
    """``RoundsOverhead`` of per-round ratios (each probed engine median over the baseline run of its
    round, of one record or pooled over several records' rounds); None with fewer than two."""
    if len(ratios) < 2:
        return None
    logs = [math.log(r) for r in ratios]
    n, mean, sd = len(logs), statistics.fmean(logs), statistics.stdev(logs)
    half = _half_width(sd, n) if sd > 0 else 0.0
    return RoundsOverhead(math.exp(mean), math.exp(mean - half), math.exp(mean + half), n)


def _half_width(sd: float, n: int) -> float:
    """Half the ``CI_LEVEL`` t interval of a mean of ``n`` log ratios of standard deviation ``sd``."""
    from scipy.stats import t  # imported only where a record has rounds

    return float(t.ppf(0.5 + CI_LEVEL / 2, n - 1)) * sd / math.sqrt(n)


MAX_ROUNDS_SHOWN = 1000
"""``rounds_to_resolve`` gives up past this many rounds (the host's noise hides the target)."""


def rounds_to_resolve(ratios: list[float]) -> Optional[int]:
    """How many rounds in all, at these rounds' mean and spread of log ratios, would put the 95%
    interval clear of ``OVERHEAD_TARGET`` on one side (``within`` or ``past``): the smallest n with
    t(n - 1) x sd / sqrt(n) below |mean - log target|. None with fewer than two rounds, or where
    more than ``MAX_ROUNDS_SHOWN`` would be needed (a mean at the target needs infinitely many)."""
    if len(ratios) < 2:
        return None
    logs = [math.log(r) for r in ratios]
    gap, sd = abs(statistics.fmean(logs) - math.log(OVERHEAD_TARGET)), statistics.stdev(logs)
    if sd == 0:
        return len(ratios) if gap > 0 else None
    if gap == 0 or _half_width(sd, MAX_ROUNDS_SHOWN) >= gap:
        return None
    n = 2
    while _half_width(sd, n) >= gap:
        n += 1
    return n


def paired_rounds(probed, baseline: Optional[dict]) -> Optional[list[tuple[float, dict]]]:
    """Each round's probed engine median (``probed``: a ``Metric``-like, its ``engine_medians``, or
    its value for one engine start) with baseline run k of ``baseline`` (a record's
    ``details.baseline``); None without either, or where they do not pair (not one baseline run per
    probed engine start, run k not round k)."""
    if probed is None:
        return None
    medians = list(getattr(probed, "engine_medians", None) or [probed.value])
    runs = runs_by_round(baseline, len(medians))
    return None if runs is None else list(zip(medians, runs))


def runs_by_round(baseline: Optional[dict], starts: int) -> Optional[list[dict]]:
    """The plain-loop runs of ``baseline`` (a record's ``details.baseline``) where there is one per
    probed engine start (``starts``) and run k is round k; None otherwise (none, or a failed run
    left the rounds unpaired)."""
    runs = list((baseline or {}).get("runs") or [])
    if not runs or len(runs) != starts or any(r.get("round") != k for k, r in enumerate(runs)):
        return None
    return runs


def prefilled_calls(run: dict) -> Optional[list[float]]:
    """A plain-loop run's timed calls (output tokens/s) where it prefilled every one in full, as the
    probed batch does (0 prompt tokens from the radix cache on every call, ``cached_tokens``); None
    where the run failed, timed nothing, did not record the cache or took prompt tokens from it."""
    timed, cached = run.get("output_throughput"), run.get("cached_tokens")
    if "error" in run or not timed or cached is None or any(cached):
        return None
    return timed


def prefilled_round_ratios(metrics: dict, baseline: Optional[dict]) -> Optional[list[float]]:
    """The overhead of each round whose plain-loop run prefilled every timed call in full, as the
    probed batch does: probed engine median k / the median of baseline run k's timed calls, for the
    rounds where run k recorded 0 prompt tokens from the radix cache on every call
    (``details.baseline.runs[].cached_tokens``; ``baseline``: that ``details.baseline``). A plain
    loop served part of its prompts from the cache did less work than the probed run, and its round
    would read the harness slower than it is. None where the record has no ``overhead``, the rounds
    do not pair (``paired_rounds``) or none is left."""
    rounds = paired_rounds(metrics.get(PROBED_THROUGHPUT), baseline) if OVERHEAD in metrics else None
    out = []
    for m, run in rounds or []:
        timed = prefilled_calls(run)
        if timed is None or m <= 0:
            continue
        base = statistics.median(timed)
        if base > 0:
            out.append(m / base)
    return out or None


def step_round_ratios(metrics: dict, baseline: Optional[dict]) -> Optional[list[float]]:
    """The overhead of each round on SGLang's own step clock: baseline run k's ``STEP_CLOCK`` over
    probed engine k's (below 1: the probed engine's fast steps are slower), for the rounds where
    both recorded it (``details.baseline.runs[].sglang_step_times``; ``baseline``: that
    ``details.baseline``). None where the rounds do not pair (``paired_rounds``) or none has both."""
    out = []
    for m, run in paired_rounds(metrics.get(STEP_CLOCK), baseline) or []:
        b = (run.get("sglang_step_times") or {}).get(STEP_CLOCK)
        if b and m and b > 0 and m > 0:
            out.append(b / m)
    return out or None


def relative_spread(values: list[float]) -> Optional[float]:
    """(max - min) / median of ``values``; None with fewer than two or a zero median."""
    if len(values) < 2:
        return None
    med = statistics.median(values)
    return (max(values) - min(values)) / med if med else None


def baseline_metrics(probed: CaseRecord, runs: list[list[float]]) -> dict[str, Metric]:
    """``baseline_output_throughput`` over the baseline runs' per-call tokens/s (``runs``, one list
    per run that timed anything) and ``overhead`` of the probed record over it; empty where no run
    timed anything, and only the baseline where the record has no ``output_throughput``."""
    runs = [r for r in runs if r]
    if not runs:
        return {}
    medians = [statistics.median(r) for r in runs]
    value = statistics.median(medians)
    base = Metric(
        value=value,
        unit="tokens/s",
        samples=[v for r in runs for v in r],
        higher_is_better=True,
        engine_medians=medians if len(runs) > 1 else None,
    )
    out = {BASELINE_THROUGHPUT: base}
    probed_tps = probed.metrics.get(PROBED_THROUGHPUT)
    if probed_tps is not None and value > 0:
        out[OVERHEAD] = Metric(
            value=probed_tps.value / value,
            unit="x",
            samples=[s / value for s in probed_tps.samples],
            higher_is_better=True,
        )
    return out


def overhead_spreads(metrics: dict) -> Optional[tuple[Optional[float], Optional[float]]]:
    """(probed spread, baseline spread) of a record's metrics ((max - min) / median of the probed
    repeats and of the baseline's timed calls; None where one has fewer than two), or None where
    the record has no ``overhead``. ``metrics``: ``Metric`` s or anything with ``samples``."""
    if OVERHEAD not in metrics:
        return None
    base = metrics.get(BASELINE_THROUGHPUT)
    return relative_spread(list(metrics[OVERHEAD].samples)), relative_spread(list(base.samples) if base else [])


def overhead_text(metrics: dict, baseline: Optional[dict] = None) -> Optional[str]:
    """A report's overhead cell: ``0.982x (spread: probed 1.3%, baseline 0.9%)``, the ratio and the
    probed and baseline spreads (``–`` where unmeasured), with the rounds' interval first where the
    group ran several (``rounds_overhead``; ``baseline``: the record's ``details.baseline``) and on
    SGLang's step clock where both loops recorded it (``step_round_ratios``); None where the record
    has no ``overhead``."""
    spreads = overhead_spreads(metrics)
    if spreads is None:
        return None
    p, b = ("–" if s is None else f"{s:.1%}" for s in spreads)
    rounds = rounds_overhead(metrics, baseline)
    paired = f"{rounds.text()}; " if rounds is not None else ""
    steps = rounds_interval(step_round_ratios(metrics, baseline) or [])
    paired += f"{steps.text('step clock')}; " if steps is not None else ""
    return f"{metrics[OVERHEAD].value:.3f}x ({paired}spread: probed {p}, baseline {b})"


def overhead_cells(metrics: dict, baseline: Optional[dict] = None) -> dict:
    """The records frame's columns beside ``overhead`` (none without it): the spreads, the rounds'
    interval and verdict (``rounds_overhead``: over the full-prefill rounds where ``baseline``, the
    record's ``details.baseline``, is given; None with fewer than two), and those rounds' ratios,
    which ``analysis.overhead`` pools over records (``prefilled_round_ratios``), beside the rounds'
    ratios on SGLang's step clock (``step_round_ratios``) and how the rounds ran (``rounds_kind``)."""
    spreads = overhead_spreads(metrics)
    if spreads is None:
        return {}
    ratios = record_round_ratios(metrics, baseline)  # the full-prefill rounds where baseline is given
    rounds = rounds_interval(ratios) if ratios is not None else None
    return {
        "overhead_round_ratios": ratios if baseline is not None else None,
        "overhead_rounds_kind": None if (kind := rounds_kind(baseline)) is None else kind.value,
        "overhead_step_round_ratios": step_round_ratios(metrics, baseline),
        "overhead_probed_spread": spreads[0],
        "overhead_baseline_spread": spreads[1],
        "overhead_ci_low": None if rounds is None else rounds.low,
        "overhead_ci_high": None if rounds is None else rounds.high,
        "overhead_verdict": None if rounds is None else rounds.verdict.value,
    }
