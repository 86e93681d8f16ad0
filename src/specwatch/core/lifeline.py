"""A worker dies with its runner, and past its own deadline.

Workers run in a process group of their own (setsid) (SGLang kills its parent's process group when
a scheduler dies, so that group must not be the runner's), which also means nothing kills them
when the runner dies. Three things do here, each started by ``hold`` in the worker:

* a parent-death signal: ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` on Linux, so the kernel kills the
  worker when the thread that started it exits (the runner waits for its worker on that thread);
* a watchdog thread on a pipe from the runner (``ENV_FD`` names its read end): when every write
  end is closed (the runner exited, however it exited) the read returns EOF and the worker kills
  its own process group, SGLang's schedulers and detokenizer with it;
* the worker's own deadline (``WorkerSpec.timeout_s``), a backstop behind the runner's group
  timeout: past it the watchdog kills the process group too. Time spent queued for the timing
  lock does not count (``paused``), as the runner's group clock does not count it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import sys
import threading
import time
from typing import Callable, Iterator, Optional

ENV_FD = "SPECWATCH_LIFELINE_FD"
"""Environment variable: the file descriptor of the pipe's read end in the worker (unset: no pipe)."""
ENV_PARENT = "SPECWATCH_LIFELINE_PARENT"
"""Environment variable: the runner's pid, so a worker whose runner died before the parent-death
signal was armed notices at once."""
PR_SET_PDEATHSIG = 1
"""``prctl`` option number (linux/prctl.h)."""
POLL_S = 0.5
"""How often the watchdog looks at its deadline while the pipe stays quiet."""


def die_with_parent() -> bool:
    """Arm the parent-death signal (SIGKILL); False where ``prctl`` is not available (not Linux)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def kill_own_group(why: str) -> None:
    """Say why on stderr (the worker's log), then SIGKILL this process's group (this process too)."""
    try:
        print(f"specwatch worker: {why}: killing its process group", file=sys.stderr, flush=True)
    finally:
        try:
            os.killpg(os.getpgrp(), signal.SIGKILL)
        finally:
            os.kill(os.getpid(), signal.SIGKILL)


class Lifeline:
    """The worker's watchdog: the runner's pipe and the worker's own deadline."""

    def __init__(
        self,
        fd: Optional[int],
        timeout_s: Optional[float],
        on_expiry: Callable[[str], None] = kill_own_group,
        now: Callable[[], float] = time.monotonic,
    ):
        self.fd, self.timeout_s, self._on_expiry, self._now = fd, timeout_s, on_expiry, now
        self._t0 = now()
        self._paused_s = 0.0
        self._paused_since: Optional[float] = None
        self._lock = threading.Lock()

    def elapsed(self) -> float:
        """Seconds since the worker started, less the time spent ``paused``."""
        with self._lock:
            queued = self._paused_s + (self._now() - self._paused_since if self._paused_since is not None else 0.0)
        return self._now() - self._t0 - queued

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """The deadline does not run inside (the worker queues for the timing lock)."""
        with self._lock:
            self._paused_since = self._now()
        try:
            yield
        finally:
            with self._lock:
                self._paused_s += self._now() - self._paused_since
                self._paused_since = None

    def check(self) -> Optional[str]:
        """Why the worker must die now (the runner's pipe closed, the deadline passed), or None."""
        if self.fd is not None:
            readable, _, _ = select.select([self.fd], [], [], 0)
            if readable and not os.read(self.fd, 1):
                return "its runner is gone (lifeline pipe closed)"
        if self.timeout_s is not None and self.elapsed() > self.timeout_s:
            return f"past its own timeout of {self.timeout_s:g} s"
        return None

    def watch(self) -> None:
        """Block until ``check`` says why, then call ``on_expiry`` with it."""
        while True:
            if self.fd is not None:
                select.select([self.fd], [], [], POLL_S)
            else:
                time.sleep(POLL_S)
            why = self.check()
            if why:
                self._on_expiry(why)
                return

    def start(self) -> "Lifeline":
        """Watch in a daemon thread."""
        if self.fd is not None or self.timeout_s is not None:
            threading.Thread(target=self.watch, name="specwatch-lifeline", daemon=True).start()
        return self


def hold(timeout_s: Optional[float] = None, fd: Optional[int] = None, parent: Optional[int] = None) -> Lifeline:
    """Everything a worker does at its start so it cannot outlive its runner: the parent-death
    signal, a check that the runner is still its parent, and the watchdog thread (pipe ``fd``,
    deadline ``timeout_s``). ``fd`` and ``parent`` default to ``ENV_FD`` and ``ENV_PARENT``; a
    process whose environment carries no specwatch variables (the baseline) is given them on its
    command line (``Pipe.argv``). Returns the watchdog (``paused`` around lock waits)."""
    die_with_parent()
    if parent is None and os.environ.get(ENV_PARENT):
        parent = int(os.environ[ENV_PARENT])
    if parent and os.getppid() != parent:
        kill_own_group(f"its runner (pid {parent}) died before it started")
    if fd is None and os.environ.get(ENV_FD):
        fd = int(os.environ[ENV_FD])
    return Lifeline(fd, timeout_s).start()


class Pipe:
    """The runner's end: a pipe whose read end only the worker holds (``pass_fds``). Close the
    write end once the worker has exited; the runner's exit closes it in any case."""

    def __init__(self):
        self.read_fd, self.write_fd = os.pipe()  # both non-inheritable (PEP 446)

    def env(self) -> dict:
        """The worker's environment entries naming the read end and the runner's pid."""
        return {ENV_FD: str(self.read_fd), ENV_PARENT: str(os.getpid())}

    def argv(self) -> list[str]:
        """The same two facts as command-line arguments (read end, runner's pid), for ``hold``'s
        ``fd`` and ``parent``."""
        return [str(self.read_fd), str(os.getpid())]

    def started(self) -> None:
        """The worker holds the read end now: the runner's copy is closed."""
        if self.read_fd is not None:
            os.close(self.read_fd)
            self.read_fd = None

    def close(self) -> None:
        for fd in (self.read_fd, self.write_fd):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.read_fd = self.write_fd = None
