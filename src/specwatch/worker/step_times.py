"""SGLang's own decode step times over a case's timed batches, beside the worker's wall time.

The suite's ``step_times`` turns SGLang's recording on for the worker's engine (``enable``: the
environment variable its scheduler reads at import, ``decode_log_interval = 1`` so every decode
forward records its step), as the release's ``rules.release_step_times`` entry names them. A case
reads the scheduler's ``step_time_dict`` right before its first timed repeat and again after its
last batch (``StepWindow``); the entries added in between are the timed batches' decode steps.

SGLang records the time since its previous decode-stats log, so the first decode step of each
timed batch also spans what ran before it (the flush, the prefill-only batches, the batch's own
prefill): one entry per timed batch that is no decode step. The window drops the largest entry per
timed batch before taking its quantiles (``dropped`` in the details says how many).

Each quantile metric has samples: the window's steps cut, in recorded order, into as many
consecutive slices as the case ran repeats (at least 2), one sample per slice, so ``compare`` and
the A/A floor test them like any timed metric. ``sglang_step_time_p10`` is the fast-state step
time: the host's vCPUs each run either at full speed or at about half of it and switch between the
two within seconds (``results/nvidia-h200-x1/host/core-speed-*.json``: 0.10-0.11 s or 0.19-0.22 s
per loop on one vCPU), so a CPU-bound decode loop's median mixes two speeds in proportions that
differ from engine to engine, while its low quantile stays on the fast one. A change that slows
every step moves it; one that slows a tenth of the steps or fewer does not (the median does).
"""

from __future__ import annotations

import os
from typing import Optional

import numpy as np

from specwatch.rules.release_step_times import StepTimeSource, step_time_source
from specwatch.worker.engine_args import server_facts
from specwatch.worker.metric_set import MetricSet

DECODE_LOG_INTERVAL = 1
"""``decode_log_interval`` the engine gets with ``step_times``: one recorded entry per decode step."""

QUANTILES = {"sglang_step_time": 50, "sglang_step_time_p90": 90, "sglang_step_time_p10": 10}
"""Metric -> the percentile of the window's step times it records."""

MIN_SLICES = 2
"""Fewest slices a window's steps are cut into (a timed metric needs two samples)."""

DISTRIBUTION_PERCENTILES = (1, 5, 10, 25, 50, 75, 90, 95, 99)
"""Percentiles of the window's steps kept in ``details.sglang_step_times.distribution_ms``: the
shape behind the three quantile metrics (a window whose steps split into a fast and a slow state
shows it between p10 and p90)."""

SLOW_STEP_FACTOR = 1.25
"""A step longer than this many times the window's p10 counts as slow (``slow_share``)."""


def distribution(ms: np.ndarray) -> dict:
    """The window's step times (ms) as ``DISTRIBUTION_PERCENTILES`` (``p1`` ... ``p99``) and ``max``,
    and ``slow_share``: the fraction of steps longer than ``SLOW_STEP_FACTOR`` x its p10."""
    out = {f"p{q}": round(float(np.percentile(ms, q)), 4) for q in DISTRIBUTION_PERCENTILES}
    out["max"] = round(float(ms.max()), 4)
    out["slow_share"] = round(float(np.mean(ms > SLOW_STEP_FACTOR * np.percentile(ms, 10))), 4)
    return out


def enable(version: str, kwargs: dict) -> Optional[StepTimeSource]:
    """Turn SGLang's step-time recording on for the engine about to start (before ``sglang.Engine``
    spawns its scheduler, which inherits this environment); returns the release's source, or None
    where the release has none known (nothing is changed then)."""
    source = step_time_source(version)
    if source is not None:
        os.environ[source.env] = "1"
        kwargs[source.interval_arg] = DECODE_LOG_INTERVAL
    return source


def _lengths(state: Optional[dict]) -> dict:
    return {k: len(v) for k, v in (state or {}).items()}


class StepWindow:
    """The step-time entries one case's timed batches add (``start`` before, ``finish`` after)."""

    def __init__(self, engine, version: str, source: Optional[StepTimeSource]):
        self.engine, self.version, self.source = engine, version, source
        self.before: Optional[dict] = None

    def start(self) -> None:
        """Read the entries so far (the probe's occupancy and gc counts restart at this read)."""
        if self.source is not None:
            self.before = _lengths(server_facts(self.engine).get("step_time_dict"))

    def finish(self, timed_batches: int, repeats: int = MIN_SLICES) -> tuple[MetricSet, dict]:
        """The window's metrics (``QUANTILES``, each with one sample per slice of ``repeats``, and
        ``sglang_steps``) and ``details.sglang_step_times``; a release without recording, or a
        scheduler that returned no dict, records why instead."""
        m = MetricSet()
        if self.source is None:
            return m, {"error": f"SGLang {self.version}: no step-time recording known for this release"}
        state = server_facts(self.engine).get("step_time_dict")
        if state is None:
            why = (
                f"get_internal_state returned no {self.source.state_key} ({self.source.env} not seen by the scheduler)"
            )
            return m, {"error": why}
        before = self.before or {}
        # in recorded order within each batch size (one size where every request ends together)
        new = [float(x) for k in sorted(state, key=int) for x in list(state[k])[before.get(k, 0) :]]
        dropped = min(timed_batches, len(new))
        steps = np.delete(new, np.argsort(new, kind="stable")[len(new) - dropped :])
        details = {
            "source": f"{self.source.recorded_in} ({self.source.state_key})",
            "decode_log_interval": DECODE_LOG_INTERVAL,
            "entries": len(new),
            "dropped": dropped,
            "batch_sizes": sorted(int(k) for k, v in state.items() if len(v) > before.get(k, 0)),
        }
        if steps.size == 0:
            details["error"] = "no decode step recorded inside the timed batches"
            return m, details
        ms = steps * 1e3
        slices = [s for s in np.array_split(ms, max(repeats, MIN_SLICES)) if len(s)]
        details["slices"] = len(slices)
        details["distribution_ms"] = distribution(ms)
        for name, q in QUANTILES.items():
            samples = [float(np.percentile(s, q)) for s in slices]
            m.put(
                name,
                float(np.percentile(ms, q)),
                "ms",
                samples if len(samples) >= MIN_SLICES else None,
                higher_is_better=False,
            )
        m.put("sglang_steps", len(steps), "steps", higher_is_better=None)
        return m, details
