"""Whether the harness widens a case's repeat spread: the two loops' spreads compared round by round.

A record with a baseline (``specwatch run --baseline``) keeps every timed repeat of each probed
engine start (``output_throughput.samples``, engine by engine, each start's count in
``details.engine_starts.engines[].timed_windows.repeats``) and every timed call of each plain-loop
run (``details.baseline.runs[].output_throughput``). The spread of all repeats of a record mixes
the host's drift between rounds into it; within one round both loops meet the same host. So each
round whose plain-loop run prefilled in full (``store.baseline.prefilled_round_ratios``) reads
the standard deviation of the log tokens/s of its probed repeats over that of its plain-loop calls
(a standard deviation, not a range: a range grows with the count, and the two loops may time
different counts). Their geometric mean over the rounds, with the 95% t interval, says whether
the probed repeats spread wider than the plain loop's (``SpreadVerdict``).

Tiny batch 16 on an H100 host, four paired rounds (``8fa79f993a7d`` in run
``20261207T144335Z-8b7051``): the probed repeats spread 0.66, 0.63, 0.79 and 0.71 times the plain
loop's, 0.69 (0.59-0.81), ``narrower``, where the spreads of all repeats read 34.9% probed
against 33.0% plain.
"""

from __future__ import annotations

import math
import statistics
from enum import Enum
from typing import Optional

from specwatch.store.baseline import OVERHEAD, PROBED_THROUGHPUT, prefilled_calls, rounds_interval, runs_by_round

SPREAD_ROUNDS = "overhead_spread_round_ratios"
"""The records frame's column of a record's per-round spread ratios (``spread_round_ratios``)."""


class SpreadVerdict(str, Enum):
    """Where the interval of the rounds' spread ratios (probed / plain) lies against 1."""

    narrower = "narrower"
    """The whole interval below 1: the probed repeats spread less than the plain loop's."""
    alike = "alike"
    """The interval holds 1: no difference the rounds can show."""
    wider = "wider"
    """The whole interval above 1: the harness widens the repeats' spread."""


def engine_repeats(details, metric) -> Optional[list[list[float]]]:
    """``metric``'s samples (a ``Metric``-like) split by engine start, in start order, by the count
    each start's ``timed_windows`` recorded; None where a start lacks the count or the counts do not
    add up to the samples (records made before starts kept their windows)."""
    engines = (getattr(details, "engine_starts", None) or {}).get("engines") or []
    samples = list(getattr(metric, "samples", None) or [])
    counts = [(e.get("timed_windows") or {}).get("repeats") for e in engines]
    if not engines or any(not isinstance(c, int) for c in counts) or sum(counts) != len(samples):
        return None
    out, start = [], 0
    for c in counts:
        out.append(samples[start : start + c])
        start += c
    return out


def log_sd(values: list[float]) -> Optional[float]:
    """Standard deviation of the logs of ``values``; None with fewer than two or a value <= 0."""
    if len(values) < 2 or min(values) <= 0:
        return None
    return statistics.stdev(math.log(v) for v in values)


def spread_round_ratios(details, metrics: dict) -> Optional[list[float]]:
    """Per round whose plain-loop run prefilled every timed call in full: the ``log_sd`` of probed
    engine start k's repeats over that of plain-loop run k's calls (``store.baseline.prefilled_calls``).
    None where the record has no ``overhead``, its repeats cannot be split by start
    (``engine_repeats``), the starts and runs do not pair (``store.baseline.runs_by_round``), or no
    round has both spreads above zero."""
    probed = engine_repeats(details, metrics.get(PROBED_THROUGHPUT)) if OVERHEAD in metrics else None
    runs = None if probed is None else runs_by_round(getattr(details, "baseline", None), len(probed))
    out = []
    for repeats, run in zip(probed or [], runs or []):
        calls = prefilled_calls(run)
        p, b = log_sd(repeats), log_sd(calls) if calls is not None else None
        if p and b:
            out.append(p / b)
    return out or None


def spread_verdict(ratios: list[float]) -> Optional[tuple[float, float, float, SpreadVerdict]]:
    """(geometric mean, interval low, high, ``SpreadVerdict``) of per-round spread ratios; None
    with fewer than two."""
    pooled = rounds_interval(ratios)
    if pooled is None:
        return None
    if pooled.high < 1:
        verdict = SpreadVerdict.narrower
    else:
        verdict = SpreadVerdict.wider if pooled.low > 1 else SpreadVerdict.alike
    return pooled.ratio, pooled.low, pooled.high, verdict


def spread_rounds_text(ratios: list[float]) -> str:
    """``0.69x (0.59-0.81, narrower; 4 rounds)``; ``0.81x (one round)``; ``not recorded``."""
    if not ratios:
        return "not recorded"
    read = spread_verdict(ratios)
    if read is None:
        return f"{ratios[0]:.2f}x (one round)"
    ratio, low, high, verdict = read
    return f"{ratio:.2f}x ({low:.2f}-{high:.2f}, {verdict.value}; {len(ratios)} rounds)"
