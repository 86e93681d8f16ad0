"""What a worker's log says about why it died, and which SGLang messages mean the host, not the case.

Read by the runner when it records a crash or a timeout, and by the results frame when it re-reads
an old record's cause from its stored log tail: one set of rules for writer and reader alike.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

from specwatch.core.record import CaseRecord

_PY_EXCEPTION = re.compile(r"^[\w.]*(?:Error|Exception)(?::|$)")
"""A Python exception line as a traceback ends: ``RuntimeError: ...``, ``torch.distributed.X: ...``."""


CPP_FRAME = re.compile(r"^frame #\d+:")
"""A line of a C++ stack trace (``frame #0: c10::Error::Error(...)``): names functions, not a cause."""


def _last_error(log_text: str) -> str:
    """The log's last Python exception line; else its last line that speaks of an error (not a C++
    stack frame: those name ``c10::Error`` after the exception that says what went wrong)."""
    lines = [line.strip() for line in log_text.splitlines()]
    for s in reversed(lines):
        if _PY_EXCEPTION.match(s):
            return s[:500]
    for s in reversed(lines):
        if (
            s
            and not CPP_FRAME.match(s)
            and ("Error" in s or "Exception" in s or "Killed" in s or "assert" in s.lower())
        ):
            return s[:500]
    return "no error line in the log"


WORKER_DIED = "worker exited with code {rc} before finishing this case: "
"""Start of a crashed record's reason; the cause found in the log follows."""


WORKER_DIED_RE = re.compile(re.escape(WORKER_DIED).replace(re.escape("{rc}"), "-?\\d+"))
"""``WORKER_DIED`` for any exit code (the dashboard strips it to show causes)."""


_DEVICE_ASSERT = re.compile(r"([\w.+-]+\.(?:cuh|cu|cpp|hpp|h)):(\d+): .*?(\w+)\(.*?Assertion `(.+?)` failed")


def device_assertion(log_text: str) -> Optional[str]:
    """The first CUDA device-side assertion in a worker's log (file:line, kernel, condition, how many
    log lines carry it), or None. Once a kernel asserts, the CUDA context is poisoned and the error
    Python raises comes from whatever ran next (often a cuBLAS call): the assertion is the cause."""
    first, lines = None, 0
    for line in log_text.splitlines():
        m = _DEVICE_ASSERT.search(line)
        if m:
            lines += 1
            first = first or m
    if first is None:
        return None
    path, line_no, kernel, cond = first.groups()
    return (
        f"device-side assertion in {Path(path).name}:{line_no} {kernel}: `{cond}` failed "
        f"({lines} line{'s' if lines > 1 else ''} of it in the log)"
    )


def crash_cause(log_text: str, device: Optional[str] = None) -> str:
    """Why a worker died, from its log: a device-side assertion first (with the Python error it
    surfaced as), else the last error line. ``device``: ``device_assertion(log_text)`` if the
    caller has it already."""
    last = _last_error(log_text)
    dev = device or device_assertion(log_text)
    return f"{dev}; surfaced as: {last[:200]}" if dev else last


def timeout_reason(timeout_s: int, log_text: str, queued_s: float = 0.0) -> str:
    """A group past its limit (``queued_s``: time not counted, queued for the timing lock); when its
    log shows SGLang had already failed (a device-side assertion, a scheduler exception), say so:
    the timeout is then that failure's teardown, not slowness."""
    reason = f"engine group ran past {timeout_s} s"
    if queued_s >= 1:
        reason += f" (not counting {queued_s:.0f} s queued for the timing lock)"
    dev = device_assertion(log_text)
    if dev or "Scheduler hit an exception" in log_text:
        reason += f"; before that the log shows: {crash_cause(log_text, dev)}"
    return reason


HOST_INTERFERENCE = {
    "The memory capacity is unbalanced": "another process held memory on one of the engine's GPUs (a concurrent run on the host), so "
    "SGLang refused to start the engine",
    "EADDRINUSE": "the port SGLang had picked for torch.distributed's rendezvous was taken before its TCP store "
    "bound it (get_free_port releases the port it found; an engine starting beside it took it)",
}
"""SGLang's messages that say a record measured the host, not the case: message fragment -> what
happened. Seen on a 2-GPU host: a one-GPU run on GPU 0 beside a tp-2 DCP sweep; a tp-2 engine
whose ``nccl_port`` another of six parallel starts took (records made before the worker chose its
own ``rendezvous_port``)."""


def host_interference(r: CaseRecord) -> Optional[str]:
    """What made the record the host's answer rather than the case's (``HOST_INTERFERENCE``), else None."""
    text = r.reason or ""
    return next((what for frag, what in HOST_INTERFERENCE.items() if frag in text), None)
