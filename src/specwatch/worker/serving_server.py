"""SGLang's HTTP server for a serving case: its command line, its process, its health, its facts.

The server gets the offline engine's arguments (``worker.engine_args.engine_kwargs``, fitted to the
installed release) as ``python -m sglang.launch_server`` flags, except ``skip_tokenizer_init``: the
serving benchmark counts streamed ``text`` chunks, so the server detokenizes. It runs in a process
group of its own with a parent-death signal (as ``core.lifeline.die_with_parent`` arms it): it dies with the
worker however the worker dies, and ``stop`` kills its whole group. Its stdout and stderr go to a
log file whose tail a failed case records.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from specwatch.core import lifeline

SERVER_MODULE = "sglang.launch_server"
"""What ``python -m`` starts: SGLang's server launcher (every release 0.5.12-0.5.23)."""

NOT_SERVER_FLAGS = ("skip_tokenizer_init",)
"""Engine arguments the server does not get: the benchmark reads the streamed text."""

OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
"""Set (where unset) for the server and the benchmark: every path is local, nothing is downloaded."""

HTTP_TIMEOUT_S = 30.0
"""Timeout of one HTTP call to the server (health, flush, server info)."""

POLL_S = 1.0
"""How often the health wait polls."""

LOG_TAIL_CHARS = 4000
"""Characters of the server log a failed case keeps."""


class NoCliForm(ValueError):
    """An engine argument ``python -m sglang.launch_server`` cannot be given (a False flag whose
    default is True: its flags are ``store_true``)."""


def server_argv(kwargs: dict, host: str, port: int, defaults: Optional[dict] = None) -> list[str]:
    """``python -m sglang.launch_server`` and the flags giving it ``kwargs`` (``--model-path`` ..),
    ``host`` and ``port``. True booleans become bare flags, False ones are left out (SGLang's bool
    flags are ``store_true``: False is their default, which ``defaults``, ServerArgs' field
    defaults, confirms where known); None values are left out."""
    argv = [sys.executable, "-m", SERVER_MODULE]
    for k, v in {**kwargs, "host": host, "port": port}.items():
        if k in NOT_SERVER_FLAGS or v is None:
            continue
        flag = "--" + k.replace("_", "-")
        if isinstance(v, bool):
            if v:
                argv.append(flag)
            elif defaults is not None and defaults.get(k) is True:
                raise NoCliForm(f"{k}=False has no command-line form: SGLang's default is True")
            continue
        argv += [flag, str(v)]
    return argv


def server_arg_defaults() -> Optional[dict]:
    """Field name -> default of the installed SGLang's ``ServerArgs`` (None: not importable)."""
    try:
        import dataclasses

        from sglang.srt.server_args import ServerArgs

        return {f.name: f.default for f in dataclasses.fields(ServerArgs)}
    except Exception:
        return None


def offline_env(base: Optional[dict] = None) -> dict:
    """``base`` (default: this process's environment) with ``OFFLINE_ENV`` where unset."""
    env = dict(os.environ if base is None else base)
    for k, v in OFFLINE_ENV.items():
        env.setdefault(k, v)
    return env


def _death_signal():
    """A ``preexec_fn`` arming the parent-death signal (SIGKILL) in the child (None off Linux).
    libc is resolved here, before the fork: the child only calls ``prctl``."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return lambda: prctl(lifeline.PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def spawn(argv: list[str], log: Path, env: Optional[dict] = None) -> subprocess.Popen:
    """``argv`` in a process group of its own that dies with this process (parent-death signal), output
    to ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        return subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=offline_env(env),
            start_new_session=True,
            preexec_fn=_death_signal(),
        )


def kill_group(proc: subprocess.Popen, grace_s: float = 10.0) -> Optional[int]:
    """SIGTERM to ``proc``'s process group, SIGKILL after ``grace_s``; returns its exit code."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, grace_s)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            return proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue
    return proc.poll()


def log_tail(log: Path, chars: int = LOG_TAIL_CHARS) -> str:
    """The last ``chars`` characters of ``log`` ("" where it cannot be read)."""
    try:
        return log.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


@dataclass
class FlushResult:
    """What ``POST /flush_cache`` answered, shaped as ``Engine.flush_cache``'s result."""

    success: bool
    message: str = ""


class ServerDown(RuntimeError):
    """The server did not come up (it exited, or stayed unhealthy past the wait)."""


class Server:
    """A started SGLang HTTP server, with the calls the worker makes to it: health, ``flush_cache``
    and ``get_server_info`` (the two ``worker.memory_facts`` makes on an ``sglang.Engine``)."""

    def __init__(self, proc: subprocess.Popen, host: str, port: int, log: Path, argv: list[str]):
        self.proc, self.host, self.port, self.log, self.argv = proc, host, port, log, argv

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _call(self, path: str, method: str = "GET", timeout: float = HTTP_TIMEOUT_S) -> tuple[int, bytes]:
        req = urllib.request.Request(self.base_url + path, method=method, data=b"" if method == "POST" else None)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def healthy(self) -> bool:
        """``/health`` and ``/model_info`` both answer 200."""
        try:
            return all(self._call(p, timeout=5.0)[0] == 200 for p in ("/health", "/model_info"))
        except (OSError, ValueError):
            return False

    def wait_healthy(self, timeout_s: float) -> float:
        """Seconds until healthy; ``ServerDown`` naming why (exit code, or the wait) otherwise."""
        t0 = time.monotonic()
        while True:
            rc = self.proc.poll()
            if rc is not None:
                raise ServerDown(f"SGLang server exited with code {rc} before it was healthy")
            if self.healthy():
                return time.monotonic() - t0
            if time.monotonic() - t0 > timeout_s:
                raise ServerDown(f"SGLang server not healthy after {timeout_s:.0f} s (/health, /model_info)")
            time.sleep(POLL_S)

    def flush_cache(self) -> FlushResult:
        """``POST /flush_cache``: 200 when flushed, 400 while requests run."""
        status, body = self._call("/flush_cache", method="POST")
        return FlushResult(status == 200, body.decode(errors="replace")[:300])

    def get_server_info(self) -> dict:
        """``GET /server_info`` as JSON (``internal_states`` carries the probe's facts)."""
        status, body = self._call("/server_info")
        if status != 200:
            raise RuntimeError(f"GET /server_info answered {status}: {body[:300]!r}")
        return json.loads(body)

    def stop(self) -> Optional[int]:
        """Kill the server's process group (its schedulers and detokenizer with it)."""
        return kill_group(self.proc)


def start_server(kwargs: dict, log: Path, port: int, env: Optional[dict] = None, host: str = "127.0.0.1") -> Server:
    """Start the server for ``kwargs`` on ``host:port`` (not yet healthy: ``Server.wait_healthy``)."""
    argv = server_argv(kwargs, host, port, server_arg_defaults())
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        out.write(("$ " + " ".join(argv) + "\n").encode())
    return Server(spawn(argv, log, env), host, port, log, argv)
