"""How engine groups share one host: serial, in waves (``--parallel-starts``) or rolling (``--overlap-starts``).

Timed batches exclude each other through the timing lock (``specwatch.core.timing_lock``);
engine starts may overlap.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import tempfile
import threading
from dataclasses import replace
from pathlib import Path
from typing import Callable, Optional

from specwatch.core.case import Backend, Case, ModelSize
from specwatch.core.timing_lock import ENV as TIMING_LOCK_ENV
from specwatch.core.timing_lock import HELD_EVENT, OVERLAP_ENV, PARALLEL_ENV, WaveGate
from specwatch.run.group import _ACTIVE_WORKERS, EXITED_EVENT, STOP_FLUSHES, finally_kill
from specwatch.run.options import RunOptions
from specwatch.run.scratch import remove_scratch


def start_class(case: Case) -> tuple:
    """How slow an engine group is to start, coarsely (seen on the H200s): tiny oracles on triton or
    fa3 start in under a minute; flashinfer compiles kernels on first use (tree kernels for topk > 1
    longest); tp > 1 adds process groups; 1b/8b checkpoints are written and loaded. A wave waits for
    its slowest start, so waves are formed from groups of one class (``wave_order``)."""
    size = {ModelSize.llama_1b: 1, ModelSize.llama_8b: 2}.get(case.model, 0)
    flashinfer = case.attention_backend is Backend.flashinfer
    return (size, case.tp, flashinfer and case.topk > 1, flashinfer)


def wave_order(jobs: list) -> list:
    """Jobs sorted by ``start_class`` of their first case (stable: suite order within a class)."""
    return sorted(jobs, key=lambda j: start_class(j.cases[0]))


def rolling_order(jobs: list) -> list:
    """``--overlap-starts``' queue: each ``start_class`` spread evenly over it, slower classes first on
    ties (suite order within a class). Waves want like with like; a rolling queue wants the opposite:
    a slow start (flashinfer compiling its kernels, ~3 min the first time on a fresh host) ties up
    one slot while the fast groups in the other slots keep the timing lock busy. In ``wave_order``
    the flashinfer groups came last, so at the end of a sweep every slot would be compiling at once
    and nothing timed. The first jobs are one of each class, slowest first, to warm the caches."""
    classes: dict = {}
    for j in jobs:
        classes.setdefault(start_class(j.cases[0]), []).append(j)
    rank = {c: r for r, c in enumerate(sorted(classes))}
    keyed = [((i / len(members), -rank[c]), j) for c, members in classes.items() for i, j in enumerate(members)]
    return [j for _, j in sorted(keyed, key=lambda kj: kj[0])]


def _parallel_env(extra_env: Optional[dict], lock_path: Path, parallel_starts: int, overlap: bool) -> dict:
    env = dict(extra_env or {}, **{TIMING_LOCK_ENV: str(lock_path), PARALLEL_ENV: str(parallel_starts)})
    if overlap:
        env[OVERLAP_ENV] = "1"
    # K engines' processes share the host's cores: keep each one's CPU thread pools small
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // parallel_starts)))
    return env


def _run_rolling(
    jobs: list, options: RunOptions, expired, count: Callable[[str], None], on_launch: Callable[[int], None]
) -> None:
    """``--overlap-starts``: up to ``options.parallel_starts`` groups in flight, the next one started as soon as
    one ends, in ``rolling_order``, until ``expired()``. Timed batches still exclude each other (the
    lock's exclusive side); starts are not held back from them. The wave design's cost, measured on
    the H200 (tree-page, K = 10): after each wave's last timed batch ~80 s passed before the next
    wave timed (its slowest start ~60 s, spawn and the last engine's teardown the rest), wall time
    2.1-2.7 x the cases' own time. ``options.timing_lock``: a lock other runs share (default: this
    run's own)."""
    parallel_starts = options.parallel_starts
    with tempfile.TemporaryDirectory(prefix="specwatch-lock-") as tmp:
        env = _parallel_env(
            options.extra_env, options.timing_lock or Path(tmp) / "timing.lock", parallel_starts, overlap=True
        )
        options = replace(options, extra_env=env)
        queue = rolling_order(jobs)
        take = threading.Lock()

        def slot() -> None:
            while True:
                with take:
                    if not queue or expired():
                        return
                    job = queue.pop(0)
                    on_launch(1)
                job.run(options, count)

        threads = [threading.Thread(target=slot, daemon=True) for _ in range(min(parallel_starts, len(queue)))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()


def _run_waves(
    jobs: list, options: RunOptions, expired, count: Callable[[str], None], on_wave: Callable[[int], None]
) -> None:
    """Run ``jobs`` in waves of ``options.parallel_starts`` (``specwatch.core.timing_lock``) until
    ``expired()``; ``on_wave`` hears each wave's size as it starts."""
    parallel_starts = options.parallel_starts
    with tempfile.TemporaryDirectory(prefix="specwatch-lock-") as tmp:
        lock_path = Path(tmp) / "timing.lock"
        options = replace(
            options, extra_env=_parallel_env(options.extra_env, lock_path, parallel_starts, overlap=False)
        )
        jobs = wave_order(jobs)
        for w in range(0, len(jobs), parallel_starts):
            if expired():
                break
            wave = jobs[w : w + parallel_starts]
            on_wave(len(wave))
            run_wave(wave, lock_path, lambda job, on_event: job.run(options, lambda ev: (count(ev), on_event(ev))))


_HELD = {"depth": 0, "signum": None, "stopping": False}
"""Main-thread state of ``stop_signals_held``: how deep, and the stop signal caught meanwhile."""


@contextlib.contextmanager
def stop_signals_held():
    """A SIGTERM/SIGINT caught by ``_kill_workers_on_sigterm`` while the main thread is inside is
    acted on when it leaves: a record written to the store is then also in the run's summary.
    (Signal handlers run in the main thread only; other threads' records are waited for by the
    handler through the record lock.)"""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _HELD["depth"] += 1
    try:
        yield
    finally:
        _HELD["depth"] -= 1
        if not _HELD["depth"] and _HELD["signum"] is not None:
            signum, _HELD["signum"] = _HELD["signum"], None
            signal.raise_signal(signum)


@contextlib.contextmanager
def _kill_workers_on_sigterm(
    on_stop: Optional[Callable[[str], None]] = None, record_lock: Optional[threading.Lock] = None
):
    """Workers run in process groups of their own (setsid; SGLang kills its parent's group when a scheduler dies),
    so a runner stopped by SIGTERM/SIGINT kills them itself; their cases stay unrecorded (resume).
    ``on_stop`` gets the signal's name first (the run's summary is written then), after a record
    being written finishes (``stop_signals_held``, ``record_lock``) and with no other one started."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        if _HELD["stopping"]:
            return  # a second signal (timeout forwards the one it got) while the first is acted on
        if _HELD["depth"]:
            _HELD["signum"] = signum  # raised again as the record's write ends
            return
        _HELD["stopping"] = True
        for pgid in list(_ACTIVE_WORKERS):
            finally_kill(pgid)
        for flush in list(STOP_FLUSHES):  # records held for a later run of their group
            try:
                flush()
            except Exception as e:  # noqa: BLE001 - the workers are dead; the summary still goes out
                print(f"specwatch: held records not appended: {e}", file=sys.stderr)
        if record_lock is not None:
            record_lock.acquire(timeout=30)  # held until exit: no record lands after the summary
        if on_stop:
            try:
                on_stop(signal.Signals(signum).name)
            except Exception as e:  # noqa: BLE001 - the workers are dead; exit regardless
                print(f"specwatch: run summary not written: {e}", file=sys.stderr)
        remove_scratch()  # the workers' temporary folders: os._exit ends no `with` block
        os._exit(128 + signum)

    old = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)


def run_wave(groups: list, lock_path: Path, run_one: Callable[[object, Callable[[str], None]], None]) -> None:
    """Run ``groups`` at once, one thread (and worker) each; see ``specwatch.core.timing_lock``."""
    holding = [threading.Event() for _ in groups]

    def body(i: int) -> None:
        try:
            run_one(groups[i], lambda ev: ev in (HELD_EVENT, EXITED_EVENT) and holding[i].set())
        finally:
            holding[i].set()  # a worker that died before taking the lock must not stall the wave

    with WaveGate(lock_path) as gate:
        threads = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(len(groups))]
        for t in threads:
            t.start()
        for h in holding:
            h.wait()
        gate.open()
    for t in threads:
        t.join()
