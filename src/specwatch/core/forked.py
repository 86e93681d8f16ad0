"""Work shared with a forked child process (the dashboard: its timing tables, figures and
findings beside its other tables), or done apart from this one (a cold store's frame caches built
in a child whose memory is returned once they are written).

The child is forked, so it shares this process's memory as it was (the records frame is neither
copied nor pickled). The calls are independent: the child takes them from the front of the list,
and this process, whenever it waits for a result, takes the next one from the back and runs it
itself (each call runs once, in whichever process claimed it: ``_Ends``). Each of the child's
results (or exceptions) comes back pickled through a pipe as soon as it is ready. Where
``os.fork`` is not used (``FORK``), each call runs in this process when its result is asked for.
"""

from __future__ import annotations

import mmap
import multiprocessing
import os
import pickle
import signal
import sys
import threading
import traceback
from typing import Any, Callable, Optional

FORK = sys.platform.startswith("linux")
"""Fork a child where fork is safe with the libraries loaded (matplotlib, Arrow): Linux."""


def _outcome(call: Callable[[], Any]) -> tuple[bool, Any]:
    """(True, the call's result) or (False, the exception it raised)."""
    try:
        return True, call()
    except Exception as e:  # noqa: BLE001 - sent to the parent, raised there
        return False, e


def _pickled(i: int, outcome: tuple[bool, Any]) -> bytes:
    """(``i``, ``outcome``) pickled; an exception (or result) that does not survive the round
    trip becomes a RuntimeError carrying its traceback."""
    try:
        data = pickle.dumps((i, outcome), protocol=pickle.HIGHEST_PROTOCOL)
        pickle.loads(data)
        return data
    except Exception:  # noqa: BLE001 - unpicklable result or exception
        ok, value = outcome
        what = "".join(traceback.format_exception(value)) if not ok else f"unpicklable result {type(value)}"
        return pickle.dumps((i, (False, RuntimeError(f"forked work failed:\n{what}"))))


class _Ends:
    """The calls not yet claimed, ``[front, back)``, in memory both processes share."""

    def __init__(self, n: int):
        self._lock = multiprocessing.Lock()
        self._mem = mmap.mmap(-1, 16)  # anonymous and shared: the child sees this process's writes
        self._set(0, n)

    def _set(self, front: int, back: int) -> None:
        self._mem[:16] = front.to_bytes(8, "little") + back.to_bytes(8, "little")

    def claim(self, from_front: bool) -> Optional[int]:
        """The next unclaimed call's index, from the front (the child) or the back; None: all claimed."""
        with self._lock:
            front, back = int.from_bytes(self._mem[:8], "little"), int.from_bytes(self._mem[8:16], "little")
            if front >= back:
                return None
            self._set(front + 1, back) if from_front else self._set(front, back - 1)
            return front if from_front else back - 1


def _child(calls: tuple[Callable[[], Any], ...], ends: _Ends, fd: int) -> None:
    """The child: the calls it claims, each outcome written to ``fd`` (8-byte length, then the
    pickle); stops after a failure, and leaves with ``os._exit`` (none of the parent's exit
    handlers run twice)."""
    code = 0
    try:
        with os.fdopen(fd, "wb") as pipe:
            while (i := ends.claim(from_front=True)) is not None:
                outcome = _outcome(calls[i])
                data = _pickled(i, outcome)
                pipe.write(len(data).to_bytes(8, "little") + data)
                pipe.flush()
                if not outcome[0]:
                    break
    except BaseException:  # noqa: BLE001 - the parent gone (broken pipe) or interrupted
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


class Forked:
    """``calls`` shared with a forked child; ``result(i)`` waits for the i-th one's result (raising
    what it raised), running unclaimed calls meanwhile. As a context manager: leaving the block
    waits for every call (raising the first failure, in call order), or, when the block raised,
    stops the child."""

    def __init__(self, *calls: Callable[[], Any]):
        self._calls = calls
        self._done: dict[int, tuple[bool, Any]] = {}
        self._pid = 0
        self._sent: list[Optional[bytes]] = []  # the child's results as read; None: the pipe ended
        self._read = 0  # of them, those unpickled into ``_done``
        self._arrived = threading.Condition()
        if FORK and calls:
            self._ends = _Ends(len(calls))
            sys.stdout.flush()
            sys.stderr.flush()
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(r)
                _child(calls, self._ends, w)
            os.close(w)
            self._pid = pid
            threading.Thread(target=self._drain, args=(os.fdopen(r, "rb"),), daemon=True).start()

    def _drain(self, pipe) -> None:
        """Read each result as the child sends it (a child never waits on a full pipe)."""
        with pipe:
            while True:
                head = pipe.read(8)
                data = pipe.read(int.from_bytes(head, "little")) if len(head) == 8 else None
                with self._arrived:
                    self._sent.append(data)
                    self._arrived.notify_all()
                if data is None:
                    return

    def result(self, i: int) -> Any:
        """The i-th call's result (its exception raised)."""
        while i not in self._done:
            if not hasattr(self, "_ends"):
                self._done[i] = _outcome(self._calls[i])
            elif self._take(block=False):
                continue  # a result came: the one wanted?
            elif (j := self._ends.claim(from_front=False)) is not None:
                self._done[j] = _outcome(self._calls[j])  # waiting: do an unclaimed call here
            elif not self._take(block=True):
                raise RuntimeError(f"forked work ended before its result {i} (exit status {self._wait()})")
        ok, value = self._done[i]
        if not ok:
            raise value
        return value

    def _take(self, block: bool) -> bool:
        """Unpickle the child's next result into ``_done``; False where none has come (``block``:
        waiting for it) or the child ended without sending more."""
        with self._arrived:
            if block:
                self._arrived.wait_for(lambda: len(self._sent) > self._read)
            data = self._sent[self._read] if len(self._sent) > self._read else None
        if data is None:  # none yet, or the pipe ended (kept: asked again, False again)
            return False
        self._sent[self._read] = b""  # read: its pickle is not kept
        self._read += 1
        j, outcome = pickle.loads(data)
        self._done[j] = outcome
        return True

    def _wait(self) -> int:
        """The child's exit status, once it has ended (0 without a child)."""
        if not self._pid:
            return 0
        pid, self._pid = self._pid, 0
        return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])

    def __enter__(self) -> "Forked":
        return self

    def join(self) -> None:
        """Wait for every call (raising the first failure, in call order) and for the child's end."""
        try:
            for i in range(len(self._calls)):
                self.result(i)
        finally:
            self._wait()

    def __exit__(self, kind, exc, tb) -> None:
        if kind is None:
            self.join()
            return
        if self._pid:
            os.kill(self._pid, signal.SIGTERM)
        self._wait()
