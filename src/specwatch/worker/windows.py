"""How many timed batches a case runs: repeats of at least ``min_timed_s`` of decode, until a CI target.

A repeat (one sample of every timed metric) is today one timed batch. With ``min_timed_s`` a repeat
runs the case's timed batch again, each time as ``measure._timed_repeat`` runs it (a flush, its
prefill-only batch, the timed batch on fresh prompts, each batch checked against its own oracle
expectation), until the batches' decode seconds add up to ``min_timed_s``; the repeat's throughput
is their tokens over their wall time. Lengthening the output instead would change the case
(``output_len`` is a case parameter: its oracle acceptance, its KV sizing, near-full's pool), so
the window grows by batches, never by tokens.

With ``ci_half_width`` repeats continue after ``repeats`` until the seeded bootstrap 95% interval
of the median output throughput is at most ``ci_half_width`` x the median, or ``max_repeats`` ran.

In a paired round (``core.turns``) the leading side judges its windows so and the following side's
windows end with them, batch for batch (``StopReason.lead``), so a round's two sides time the same
stretch of the host.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from specwatch.core.protocol import StopReason
from specwatch.core.turns import process_turns

BOOTSTRAP_RESAMPLES = 2000
"""Resamples of the bootstrap interval of the median."""

BOOTSTRAP_SEED = 0
"""Seed of the bootstrap: the same samples always give the same interval (and the same stop)."""

MAX_BATCHES_PER_REPEAT = 1000
"""Most timed batches one repeat runs, whatever ``min_timed_s`` asks (a batch that takes no time)."""


def median_ci_half_width(samples: list[float], seed: int = BOOTSTRAP_SEED) -> Optional[float]:
    """Half the width of the percentile bootstrap 95% CI of the median of ``samples`` (None: fewer
    than 2 samples, no interval)."""
    if len(samples) < 2:
        return None
    x = np.asarray(samples, dtype=float)
    rng = np.random.default_rng(seed)
    medians = np.median(x[rng.integers(0, len(x), size=(BOOTSTRAP_RESAMPLES, len(x)))], axis=1)
    lo, hi = np.percentile(medians, [2.5, 97.5])
    return float(hi - lo) / 2


@dataclass(frozen=True)
class RepeatPlan:
    """How a case's repeats are made (the suite's ``repeats``, ``min_timed_s``, ``ci_half_width``,
    ``max_repeats``)."""

    repeats: int
    min_timed_s: Optional[float] = None
    ci_half_width: Optional[float] = None
    max_repeats: Optional[int] = None

    @property
    def fixed(self) -> bool:
        """One timed batch per repeat, ``repeats`` of them: the measurement as without windows."""
        return self.min_timed_s is None and self.ci_half_width is None

    @classmethod
    def of_spec(cls, spec) -> "RepeatPlan":
        """The plan a ``WorkerSpec`` asks for."""
        return cls(spec.repeats, spec.min_timed_s, spec.ci_half_width, spec.max_repeats)


@dataclass
class RepeatLoop:
    """Decides, sample by sample, whether a repeat needs another batch and the case another repeat."""

    plan: RepeatPlan
    batches: list[int] = field(default_factory=list)
    """Timed batches of each finished repeat."""
    ci_rel: Optional[float] = None
    """The last CI half-width over the median (relative), when a CI target is set."""
    stopped_by: Optional[StopReason] = None

    def more_repeats(self, samples: list[float]) -> bool:
        """Whether another repeat runs, given each finished repeat's output throughput."""
        done, plan = len(samples), self.plan
        if done < plan.repeats:
            return True
        if plan.ci_half_width is None:
            self.stopped_by = StopReason.repeats
            return False
        half = median_ci_half_width(samples)
        med = statistics.median(samples)
        self.ci_rel = None if half is None or not med else half / med
        if self.ci_rel is not None and self.ci_rel <= plan.ci_half_width:
            self.stopped_by = StopReason.ci_target
            return False
        if done >= (plan.max_repeats or plan.repeats):
            self.stopped_by = StopReason.max_repeats
            return False
        return True

    def window_full(self, batches: int, decode_s: float) -> bool:
        """Whether a repeat of ``batches`` timed batches holding ``decode_s`` of decode is complete."""
        if self.plan.min_timed_s is None:
            return True
        return decode_s >= self.plan.min_timed_s or batches >= MAX_BATCHES_PER_REPEAT

    def run(self, one_batch, samples, windows: Optional[list[int]], reader=None) -> None:
        """Run repeats of ``one_batch()`` calls (each returns the decode seconds its batch counts)
        while ``more_repeats(samples())``, each call one turn of ``core.turns`` where the process
        takes turns; each repeat's batch count goes to ``windows`` too. In a paired round the
        leading side's window start and ends go with its turns, and the following side times its
        first batch after the leader's (``Turns.wait_for_lead``) and ends its windows and repeats
        with the leader's (``_window_end``). ``reader``: its ``begin()`` and ``end()`` around each
        repeat (``worker.cpu_readings``)."""
        turns, more = process_turns(), self.more_repeats(samples())
        windowed = not self.plan.fixed  # only windows are led and followed
        if windowed:  # a follower's first batch waits for the leader's
            turns.wait_for_lead()
        while more:
            n, decode_s, full = 0, 0.0, False
            if reader is not None:
                reader.begin()
            while not full:  # one repeat: timed batches until the window is full
                with turns.hold():  # one batch a turn; the window's start and end go with it
                    if windowed and n == 0 and not self.batches:  # the case's first timed batch
                        turns.start_windows()
                    n, decode_s = n + 1, decode_s + one_batch()
                    full, more = self._window_end(turns, n, decode_s, samples, windows)
            if reader is not None:
                reader.end()

    def _window_end(self, turns, n: int, decode_s: float, samples, windows: Optional[list[int]]) -> tuple[bool, bool]:
        """After a repeat's ``n``-th batch: (whether the repeat ends, whether another follows). A
        following side (``Turns.following``, windows only) ends it where the leader ended one, and
        its repeats with the leader's last (at most the plan's own most); otherwise the plan's rules
        decide, and a leading side hands the end on (``Turns.end_window``)."""
        follows = turns.following and not self.plan.fixed
        lead = turns.follow() if follows else None
        if follows and lead is None and n < MAX_BATCHES_PER_REPEAT:
            return False, True
        if not follows and not self.window_full(n, decode_s):
            return False, True
        self.batches.append(n)
        if windows is not None:
            windows.append(n)
        more = self.more_repeats(samples())  # the plan's rules; a follower keeps only the CI it reached
        if follows:  # the leader's end decides, within the plan's most repeats
            cap = max(self.plan.repeats, self.plan.max_repeats or 0)
            more = lead is False and len(self.batches) < cap
            self.stopped_by = None if more else (StopReason.lead if lead else StopReason.max_repeats)
        elif not self.plan.fixed:
            turns.end_window(last=not more)
        return True, more

    def details(self) -> dict:
        """``details.timed_windows`` of the record (``core.details.TimedWindows``)."""
        return {
            "repeats": len(self.batches),
            "batches_per_repeat": list(self.batches),
            "min_timed_s": self.plan.min_timed_s,
            "ci_half_width_target": self.plan.ci_half_width,
            "ci_half_width": None if self.ci_rel is None else round(self.ci_rel, 6),
            "max_repeats": self.plan.max_repeats if self.plan.ci_half_width is not None else None,
            "stopped_by": self.stopped_by.value if self.stopped_by else None,
        }


@dataclass(frozen=True)
class TimedBatch:
    """What one timed batch measured, for the repeat that holds it."""

    tokens: int
    """Output tokens of the batch."""
    requests: int
    wall: float
    prefill_s: float
    """Its prefill-only batch's seconds."""
    decode_tokens: int
    """Output tokens after each request's first."""
    decode_s: Optional[float]
    """Wall time less prefill (None: prefill-dominated, no decode split)."""
    verify: int
    """Verify steps (plain decoding: decode steps)."""

    @property
    def timed_decode_s(self) -> float:
        """Decode seconds the window counts (the whole wall time where there is no decode split)."""
        return self.wall if self.decode_s is None else self.decode_s


def window_samples(batches: list[TimedBatch], sizes: list[int], output_len: int) -> dict[str, list[float]]:
    """Per repeat (``sizes``: its batches, in order) the timed metrics' samples: throughput as
    tokens over wall seconds summed over the repeat's batches, wall and prefill time as the mean
    batch's, decode metrics over the batches with a decode split."""
    out: dict[str, list[float]] = {k: [] for k in ("tps", "walls", "prefills", "decode_tps", "step_ms", "itl_ms")}
    i = 0
    for n in sizes:
        w, i = batches[i : i + n], i + n
        wall = sum(b.wall for b in w)
        out["tps"].append(sum(b.tokens for b in w) / wall)
        out["walls"].append(wall / n)
        out["prefills"].append(sum(b.prefill_s for b in w) / n)
        split = [b for b in w if b.decode_s is not None]
        if split:
            dec = sum(b.decode_s for b in split)
            out["decode_tps"].append(sum(b.decode_tokens for b in split) / dec)
            out["step_ms"].append(1e3 * dec / sum(max(b.verify, 1) for b in split))
            out["itl_ms"].append(1e3 * dec / (len(split) * max(output_len - 1, 1)))
    return out
