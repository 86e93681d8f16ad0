"""A group's timeout clock, paused while the group's engine is up and queued for the timing lock."""

from __future__ import annotations

import time
from typing import Callable, Optional

from specwatch.core.protocol import Event


class GroupClock:
    """A group's timeout clock. It does not run while the worker's engine is up and the worker
    queues for the timing lock (from ``engine_started`` to ``TIMING_EVENT``): under
    ``--parallel-starts`` that wait is other groups' timed batches, not this group's work (on the
    H200 three flashinfer groups of a wave of 10 were cut at 280 s while queued, their engines up)."""

    def __init__(self, timeout_s: float, now: Callable[[], float] = time.monotonic):
        self.timeout_s, self._now = timeout_s, now
        self._t0 = now()
        self._paused_s = 0.0
        self._queued_since: Optional[float] = None
        self.engine_started = False
        """Whether the worker's engine came up (a death before it hits every case of the group)."""

    def on_event(self, event: Optional[str]) -> None:
        if event == Event.engine_started and not self.engine_started:
            self.engine_started = True
            self._queued_since = self._now()
        elif event == Event.timing_lock_held and self._queued_since is not None:
            self._paused_s += self._now() - self._queued_since
            self._queued_since = None

    @property
    def queued_s(self) -> float:
        """Seconds spent with the engine up, queued for the timing lock (not counted)."""
        return self._paused_s + (self._now() - self._queued_since if self._queued_since is not None else 0.0)

    def elapsed(self) -> float:
        return self._now() - self._t0 - self.queued_s

    def expired(self) -> bool:
        return self.elapsed() > self.timeout_s
