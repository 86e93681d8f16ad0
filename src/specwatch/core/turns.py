"""Turns between two processes that time on one host at once: one unit of engine work each, in turn.

``specwatch run --paired`` keeps two engines up together, the probed worker's and the plain loop's
(``--baseline``) or those of two ``--fault`` passes, and lets them take turns: each holds the turn for one unit of its engine's work (a timed
batch with its untimed preparation, a warm-up, a read of the scheduler's state), then hands it to
the other. Timed batches of the two then alternate within a second or so of each other, and so
share the host's state, where a round-by-round pairing compares windows tens of seconds apart:
on the H100 hosts measured, the share of SGLang's decode steps in the host's slow state changed
from one 2 s slice of a window to the next (``store.step_state``).

The turn is a byte passed through two pipes the runner makes (``TurnPipes``): each process reads
its own pipe to take the turn and writes the other's to hand it on. A process that ends closes its
ends; the other then reads end-of-file and runs on alone (``Turns.alone``), as it does when the other
process dies. ``Turns.hold`` is re-entrant: a unit inside a held one does not hand the turn on.

Windows in lockstep: where each side times repeats by duration (``worker.windows.RepeatLoop``),
side ``a`` (the probed worker, or the first ``--fault`` pass) leads. The byte it hands on after the
batch that ends one of its windows says so (``WINDOW_END``, or ``LAST_WINDOW`` after its last
repeat), and side ``b`` ends its own window on the batch it runs next, and its repeats with the
leader's. Each side judging its own windows drifts apart: the plain loop counts a batch's wall
seconds, the probed worker its decode seconds, so at tiny batch 16 the probed windows held one or two
batches more and its last repeats ran alone after the plain loop had ended (record
``8fa79f993a7d@20261207T144617Z``: 45 timed batches probed against 41 plain in round 0).

The first window starts with the leader's too: the leader's first timed batch of a case hands on
``WINDOW_START`` (unless it ended a repeat, whose end says as much), and until it comes the follower
hands each turn straight back (``Turns.wait_for_lead``), then times its first batch on the turn that
brought it. Without it the plain loop began timing while the probed worker still ran untimed units
and its first windows held 1-3 batches more (7/6, 8/6, 7/6, 9/7 in record
``8fa79f993a7d@20261207T221242Z``).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from typing import Callable, Iterator, Optional

ENV = "SPECWATCH_TURNS"
"""Environment variable naming the worker's ends, ``READ_FD,WRITE_FD`` (unset: no turns)."""

TOKEN = b"t"
"""The byte that is the turn."""

WINDOW_END = b"w"
"""The turn, from the leading side after a batch that ended one of its repeats (more follow)."""

LAST_WINDOW = b"e"
"""The turn, from the leading side after a batch that ended its last repeat of a case."""

WINDOW_START = b"s"
"""The turn, from the leading side after its first timed batch of a case where that batch ended no
repeat: the following side times its first batch of the case on the turn that brings it."""

SIDE_A, SIDE_B = "a", "b"
"""The two sides of a round's turns: the probed worker (or a run's first ``--fault`` pass), which
leads the windows, and the plain loop (or the second pass), which follows them."""


class Turns:
    """One process's side of the turns: ``hold`` around each unit of engine work."""

    def __init__(self, read_fd: Optional[int] = None, write_fd: Optional[int] = None, side: Optional[str] = None):
        self.read_fd, self.write_fd = read_fd, write_fd
        self.side = side
        """``SIDE_A`` (leads the windows), ``SIDE_B`` (follows them) or None (windows of its own)."""
        self.paired = read_fd is not None
        """The process was given ends: it takes turns with another (until ``alone``)."""
        self.alone = read_fd is None
        """The other process has ended (or there is none): units run without waiting."""
        self.held = False
        """A unit holds the turn now (a hold inside it keeps it)."""
        self.units = 0
        """Units held so far (outermost holds)."""
        self.waited_s = 0.0
        """Seconds spent waiting for the turn."""
        self.signal: bytes = TOKEN
        """The byte the current unit hands on (``end_window`` sets it)."""
        self.from_lead: list[bytes] = []
        """What the leader's turns said and was not yet followed (window starts and ends), oldest first."""
        self.passed = 0
        """Turns handed straight back while waiting for the leader's first timed batch (``wait_for_lead``)."""
        self._kept = False
        """``wait_for_lead`` took the turn and keeps it for the next ``hold``."""

    @classmethod
    def parse(cls, ends: Optional[str]) -> "Turns":
        """``READ_FD,WRITE_FD[,SIDE]`` (``ENV``'s or the baseline's argument form); None or empty: no turns."""
        if not ends:
            return cls()
        read_fd, write_fd, *side = ends.split(",")
        return cls(int(read_fd), int(write_fd), side[0] if side else None)

    @property
    def leading(self) -> bool:
        """Side ``a`` of turns still taken: its window ends go to the other side (``end_window``)."""
        return self.side == SIDE_A and not self.alone

    @property
    def following(self) -> bool:
        """Side ``b`` of turns still taken: its windows end with the leader's (``follow``)."""
        return self.side == SIDE_B and not self.alone

    def start_windows(self) -> None:
        """Leading: the unit held now is the case's first timed batch; the turn handed on says so
        (``end_window`` after it says more)."""
        if self.leading:
            self.signal = WINDOW_START

    def end_window(self, last: bool) -> None:
        """Leading: the unit held now ended a repeat (``last``: the case's last); the turn handed on says so."""
        if self.leading:
            self.signal = LAST_WINDOW if last else WINDOW_END

    def follow(self) -> Optional[bool]:
        """Following: whether the leader ended a repeat before the batch just run (None: it did not;
        False: it did, more follow; True: that was its last), each end read once."""
        while self.from_lead:
            got = self.from_lead.pop(0)
            if got != WINDOW_START:
                return got == LAST_WINDOW
        return None

    def wait_for_lead(self) -> None:
        """Following, before a case's first timed batch: drop what the leader said of earlier cases
        (everything through its last ``LAST_WINDOW``), then hand each turn straight back until the
        leader has timed its first batch of this case, and keep the turn that says so for that batch
        (the next ``hold`` takes no other). Where the leader's start came already (it began first)
        or the leader ends meanwhile, it returns without keeping a turn."""
        if not self.following or self.held:
            return
        while LAST_WINDOW in self.from_lead:
            del self.from_lead[: self.from_lead.index(LAST_WINDOW) + 1]
        if self._lead_started():
            return
        while True:
            self._take()
            if not self.following:
                return
            if self._lead_started():
                self._kept = True
                return
            self.passed += 1
            self._hand_on()

    def _lead_started(self) -> bool:
        """Whether the leader has timed its first batch of the case: a start read (dropped here) or an end."""
        if self.from_lead and self.from_lead[0] == WINDOW_START:
            self.from_lead.pop(0)
            return True
        return bool(self.from_lead)

    def _take(self) -> None:
        if self.alone:
            return
        t = time.perf_counter()
        try:
            got = os.read(self.read_fd, 1)
        except OSError:
            got = b""
        self.waited_s += time.perf_counter() - t
        if not got:  # every write end closed: the other process ended
            self.alone = True
        elif got != TOKEN and self.side == SIDE_B:
            self.from_lead.append(got)

    def _hand_on(self) -> None:
        signal, self.signal = self.signal, TOKEN
        if self.write_fd is None:
            return
        try:
            os.write(self.write_fd, signal)
        except OSError:  # the other process ended (its read end is closed)
            self._close_write()

    def _close_write(self) -> None:
        if self.write_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.write_fd)
            self.write_fd = None

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """Take the turn (wait for it, unless alone), run the unit, hand the turn on; a hold inside a
        held one only runs its unit."""
        if self.held:
            yield
            return
        if self._kept:  # wait_for_lead took this turn
            self._kept = False
        else:
            self._take()
        self.held, self.units = True, self.units + 1
        try:
            yield
        finally:
            self.held = False
            self._hand_on()

    def close(self) -> None:
        """Close both ends: the other process then runs on alone."""
        self._close_write()
        if self.read_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.read_fd)
            self.read_fd = None
        self.alone = True

    def last_unit(self, shutdown: Callable[[], object]) -> None:
        """Run ``shutdown`` (an engine going down) as this process's last unit, so the other process
        times nothing meanwhile, then ``close``; an error of ``shutdown`` (an engine without one
        included, where the caller reads it inside) is swallowed: the process is ending and what it
        measured is written."""
        with self.hold(), contextlib.suppress(Exception):
            shutdown()
        self.close()

    def details(self) -> dict:
        """What a record says of the turns: units held, seconds waited for them, the side, and the turns
        passed waiting for the leader (where any)."""
        return {
            "units": self.units,
            "waited_s": round(self.waited_s, 3),
            **({"side": self.side} if self.side else {}),
            **({"passed": self.passed} if self.passed else {}),
        }


_PROCESS: list[Turns] = []


def process_turns() -> Turns:
    """This process's turns: set by ``use`` (the baseline), else from ``ENV`` (the worker), else none."""
    if not _PROCESS:
        _PROCESS.append(Turns.parse(os.environ.get(ENV)))
    return _PROCESS[0]


def use(turns: Turns) -> Turns:
    """Make ``turns`` this process's (``process_turns``)."""
    _PROCESS[:] = [turns]
    return turns


def ends_arg(ends: tuple[int, int], side: str) -> str:
    """``READ_FD,WRITE_FD,SIDE``: a side's ends as ``ENV`` and the baseline's argument give them (``Turns.parse``)."""
    return ",".join([*map(str, ends), side])


class TurnPipes:
    """The runner's side: the two pipes of one round, side ``a``'s ends and side ``b``'s, and the
    first turn given once both processes have started (``started``)."""

    SIDES = (SIDE_A, SIDE_B)

    def __init__(self, first: str = SIDE_A):
        self.to_a, self.to_b = os.pipe(), os.pipe()
        self.first = first
        self._started: set[str] = set()
        self._taken: set[str] = set()
        self._lock = threading.Lock()
        self._closed = False

    def ends(self, side: str) -> tuple[int, int]:
        """(read, write) of ``side``: it reads its own pipe and writes the other's."""
        if side == SIDE_A:
            return self.to_a[0], self.to_b[1]
        return self.to_b[0], self.to_a[1]

    def take(self, side: str) -> Optional[tuple[int, int]]:
        """``side``'s ends for the process about to start, once: None after it started (a worker
        started again in the same round runs without turns)."""
        with self._lock:
            if side in self._taken or self._closed:
                return None
            self._taken.add(side)
            return self.ends(side)

    def started(self, side: str) -> None:
        """``side``'s process has started with its ends (or will not start): once both have, give
        the first turn and close the runner's copies, so each process reads end-of-file when the
        other one ends."""
        with self._lock:
            self._started.add(side)
            if self._closed or self._started < set(self.SIDES):
                return
            self._closed = True
            with contextlib.suppress(OSError):  # the first side's pipe is written by the other side's end
                os.write(self.ends(SIDE_B if self.first == SIDE_A else SIDE_A)[1], TOKEN)
            for fd in (*self.to_a, *self.to_b):
                with contextlib.suppress(OSError):
                    os.close(fd)

    def close(self) -> None:
        """Mark both sides started (a round that ended): the runner's copies are closed."""
        for side in self.SIDES:
            self.started(side)
