"""Start engines in parallel, time them one at a time (``specwatch run --parallel-starts K``).

An engine start costs 40-60 s of mostly CPU work (process spawns, imports, weight loading, CUDA
graph capture) while a case's timed part costs seconds, so a sweep's wall time is its engine
starts. With ``K > 1`` the runner launches engine groups in waves of K workers that share one
lock file (``flock``):

* a worker holds the lock **shared** while it starts its engine (and writes oracle models);
* it converts to **exclusive** before warm-up and timing, and keeps it until it exits.

Starts therefore overlap each other but never a timed batch, and timed batches never overlap each
other. The runner itself holds the lock shared until every worker of the wave holds it, so a worker
whose engine is up early cannot start timing while a slower sibling is still importing SGLang.
``--overlap-starts`` (``OVERLAP_ENV``) drops the shared hold and the waves: K groups stay in flight
and a freed slot starts the next at once, so starts overlap timed batches (cheaper sweeps, noisier
timing; records say ``details.overlap_starts``), while timed batches still exclude each other.
An idle started engine waiting for its turn costs GPU memory only (the tiny oracle's engine
holds ~5 GiB), not GPU time. Engine start times measured under parallel starts are inflated by
contention; records say so in ``details.parallel_starts``.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path
from typing import Callable, Optional

from specwatch.core.protocol import Event

ENV = "SPECWATCH_TIMING_LOCK"
"""Environment variable naming the lock file a worker must use (unset: no locking)."""
PARALLEL_ENV = "SPECWATCH_PARALLEL_STARTS"
"""Environment variable with K (recorded in each case's details)."""
OVERLAP_ENV = "SPECWATCH_OVERLAP_STARTS"
"""Environment variable: "1" when starts may overlap other engines' timed batches (``--overlap-starts``):
the worker starts its engine without the shared lock, so only timed batches exclude each other."""
HELD_EVENT = Event.start_lock_held
"""Worker results-file event: the worker holds the lock shared (it may start its engine)."""
ENGINE_STARTED_EVENT = Event.engine_started
"""Worker results-file event: ``sglang.Engine`` is up (carries ``engine_start_s``)."""
ENGINE_FACTS_EVENT = Event.engine_facts
"""Worker results-file event: the probe's pool checks read right after the engine started (carries
``metrics``, ``checks``, ``details``); the runner puts them on a crash or timeout record of the group."""
TIMING_EVENT = Event.timing_lock_held
"""Worker results-file event: the worker's engine is up and it now holds the lock exclusively (it
times its cases); carries ``waited_s``. Between ``engine_started`` and this event the worker only
queues behind other engines' timed batches, so the runner's group deadline does not run then."""


class TimingLock:
    """One open description of the lock file (``flock`` locks belong to it). No-op without a path."""

    def __init__(self, path: Optional[str | Path]):
        self._fd = open(path, "a") if path else None

    @property
    def enabled(self) -> bool:
        return self._fd is not None

    def shared(self) -> None:
        if self._fd:
            fcntl.flock(self._fd, fcntl.LOCK_SH)

    def exclusive(self) -> float:
        """Wait until nobody else holds the lock; returns the seconds waited."""
        if not self._fd:
            return 0.0
        t = time.perf_counter()
        fcntl.flock(self._fd, fcntl.LOCK_EX)  # drops a shared lock first (flock(2)), then waits
        return time.perf_counter() - t

    def release(self) -> None:
        if self._fd:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            self._fd.close()
            self._fd = None


class WorkerTimingLock(TimingLock):
    """The worker's side: shared while starting, exclusive while timing. No-op without ``ENV``."""

    def __init__(self, path: Optional[str] = None):
        super().__init__(path if path is not None else os.environ.get(ENV))

    @property
    def overlapping(self) -> bool:
        """Starts overlap other engines' timing (``OVERLAP_ENV``): no shared hold while starting."""
        return self.enabled and os.environ.get(OVERLAP_ENV) == "1"

    def starting(self, emit: Callable[[dict], None]) -> None:
        if self.enabled:
            if not self.overlapping:
                self.shared()
            emit({"event": HELD_EVENT})

    def timing(self, emit: Optional[Callable[[dict], None]] = None) -> float:
        """Wait until no other worker is starting or timing; returns the seconds waited and, with
        ``emit``, reports them as a ``TIMING_EVENT`` line (sent also without a lock: waited 0)."""
        waited = self.exclusive()
        if emit:
            emit({"event": TIMING_EVENT, "waited_s": round(waited, 3)})
        return waited


class WaveGate(TimingLock):
    """The runner's side: hold the lock shared until every worker of a wave holds it."""

    def __enter__(self) -> "WaveGate":
        self.shared()
        return self

    def open(self) -> None:
        self.release()

    def __exit__(self, *exc) -> None:
        self.release()
