"""The store's growth curve as asv tracks: ``specwatch results``, ``compare`` and ``dashboard`` on
synthetic N-times stores (``scripts/synth_store.py``) of the committed results.

``setup_cache`` writes one store per scale (``SPECWATCH_STORE_SCALES``, default ``10,100``; source
``SPECWATCH_RESULTS``, default ``results/``, its noise-budget file copied too) under a temporary
folder, once per asv environment; each track runs the CLI in a child process and reports its wall
time (s) or its peak resident memory (MB), cold (no Parquet cache: the first read of a store) or warm. Slow (a 100x store is
about 110k records): run it with ``asv run --bench StoreScale``; the quick tests run it on a tiny store.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

COMMANDS = {
    "results": ["results", "{R}"],
    "compare": [
        "compare",
        "sglang_version=0.5.16,suite=tree-page",
        "sglang_version=0.5.17,suite=tree-page",
        "--results",
        "{R}",
    ],
    "dashboard": ["dashboard", "--results", "{R}", "--out", "{O}"],
}
"""The commands measured (compare: the tree-page pair of ``scripts/reports.sh``), ``{R}`` the store."""


BUDGET_FILE = "noise-budgets.json"
"""The source store's A/A pairs, copied into each synthetic store: their selections match every copy
of the pairs' runs, so the detection floor (read by ``compare`` and the dashboard) is measured at scale."""


def scales() -> list[int]:
    return [int(x) for x in os.environ.get("SPECWATCH_STORE_SCALES", "10,100").split(",") if x.strip()]


def make_stores(folder: Path, source: Path, sizes: list[int]) -> dict[int, str]:
    """One synthetic store per size under ``folder``: size -> its results root."""
    spec = importlib.util.spec_from_file_location("synth_store", ROOT / "scripts" / "synth_store.py")
    synth = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(synth)
    out = {}
    for n in sizes:
        root = folder / f"x{n}"
        if not root.exists():
            synth.synth_store(n, root, source)
            if (source / BUDGET_FILE).is_file():  # the A/A pairs: compare's and the dashboard's floor
                shutil.copyfile(source / BUDGET_FILE, root / BUDGET_FILE)
        out[n] = str(root)
    return out


def run_cli(command: str, root: str, cold: bool) -> tuple[float, float]:
    """(wall seconds, peak resident MB) of one ``specwatch COMMAND`` on the store at ``root``;
    ``cold``: its Parquet caches removed first."""
    if cold:
        for p in Path(root).rglob("*.jsonl.parquet"):
            p.unlink()
    with tempfile.TemporaryDirectory(prefix="specwatch-dash-") as out:
        argv = [a.replace("{R}", root).replace("{O}", out) for a in COMMANDS[command]]
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-m", "specwatch.cli", *argv],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    if proc.returncode not in (0, 1):  # compare exits 1 on a regression: its verdict, not a failure
        raise RuntimeError(f"specwatch {command} exited {proc.returncode}")
    return wall, usage.ru_maxrss / 1024


def _track(what: int, cold: bool, unit: str):
    def track(self, stores, scale, command):
        return run_cli(command, stores[scale], cold)[what]

    track.unit = unit
    return track


class StoreScale:
    """Time and peak memory of the store's readers at N times the committed history."""

    param_names = ["scale", "command"]
    params = [scales(), list(COMMANDS)]
    timeout = 1800
    number = 1
    repeat = 1

    def setup_cache(self):
        source = Path(os.environ.get("SPECWATCH_RESULTS", ROOT / "results"))
        folder = Path(os.environ.get("SPECWATCH_STORE_DIR") or tempfile.mkdtemp(prefix="specwatch-stores-"))
        return make_stores(folder, source, scales())

    track_cold_wall = _track(0, True, "seconds")
    track_cold_peak_rss = _track(1, True, "MB")
    track_warm_wall = _track(0, False, "seconds")
    track_warm_peak_rss = _track(1, False, "MB")
