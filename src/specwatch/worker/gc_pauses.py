"""Garbage-collector pauses of the worker process inside a timed window."""

from __future__ import annotations

import gc
import time


class GcPauses:
    """This process's garbage-collector pauses while armed (``gc.callbacks``): the worker hosts
    SGLang's tokenizer manager, whose event loop a collection stalls inside a timed ``generate``."""

    def __init__(self):
        self.collections, self.pause_s, self._t0 = 0, 0.0, None

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        elif self._t0 is not None:
            self.collections, self.pause_s = self.collections + 1, self.pause_s + time.perf_counter() - self._t0

    def __enter__(self) -> "GcPauses":
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc) -> None:
        gc.callbacks.remove(self)
