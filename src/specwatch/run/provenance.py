"""Provenance: what code, on which machine, produced a record."""

from __future__ import annotations

import functools
import os
import platform
import socket
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Optional

from specwatch import __version__
from specwatch.core.record import Provenance
from specwatch.core.sglang_host import sglang_version


def _run(cmd: list[str], cwd: Optional[Path] = None) -> Optional[str]:
    try:
        out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else None


@functools.lru_cache(maxsize=None)
def specwatch_commit() -> Optional[str]:
    """Commit of the specwatch checkout (``SPECWATCH_COMMIT`` wins, for copies without .git)."""
    return os.environ.get("SPECWATCH_COMMIT") or _run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent)


@functools.lru_cache(maxsize=None)
def host_facts() -> dict:
    """GPU, driver, CUDA and torch facts of this host (GPU fields None without a GPU)."""
    facts: dict = {
        "torch_version": None,
        "cuda_version": None,
        "gpu_name": None,
        "gpu_count": 0,
        "driver_version": None,
    }
    try:
        import torch

        facts["torch_version"] = torch.__version__
        facts["cuda_version"] = torch.version.cuda
        if torch.cuda.is_available():
            facts["gpu_count"] = torch.cuda.device_count()
            facts["gpu_name"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    smi = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    if smi:
        facts["driver_version"] = smi.splitlines()[0].strip()
    return facts


def machine_label(facts: Optional[dict] = None) -> str:
    """Results are grouped by this: ``SPECWATCH_MACHINE``, else derived from the GPU, else 'cpu'."""
    if os.environ.get("SPECWATCH_MACHINE"):
        return os.environ["SPECWATCH_MACHINE"]
    facts = facts or host_facts()
    if not facts["gpu_name"]:
        return "cpu"
    name = facts["gpu_name"].lower().replace("nvidia ", "nvidia-").replace(" ", "-")
    return f"{name}-x{facts['gpu_count']}"


def sglang_commit() -> Optional[str]:
    """SGLang commit when known: ``SPECWATCH_SGLANG_COMMIT`` (commit overlays set it)."""
    from specwatch.core.sglang_host import COMMIT_ENV

    return os.environ.get(COMMIT_ENV)


def collect(
    started_at: datetime,
    finished_at: datetime,
    suite_path: Optional[str] = None,
    suite_sha256: Optional[str] = None,
    fault: Optional[str] = None,
    probe: bool = True,
) -> Provenance:
    facts = host_facts()
    return Provenance(
        specwatch_version=__version__,
        specwatch_commit=specwatch_commit(),
        sglang_version=sglang_version(),
        sglang_commit=sglang_commit(),
        hostname=socket.gethostname(),
        machine=machine_label(facts),
        python_version=platform.python_version() or sys.version.split()[0],
        suite_path=suite_path,
        suite_sha256=suite_sha256,
        fault=fault,
        probe=probe,
        started_at=started_at,
        finished_at=finished_at,
        **facts,
    )
