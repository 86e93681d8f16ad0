"""The store at scale: ``specwatch dashboard`` and ``specwatch results`` on an N-times store, as a table.

Builds an N-times synthetic store of the committed results (``synth_store.py``; 72 copies: about
100k records; the noise-budget file and run summaries copied as they are), then times on it, one
after the other: the dashboard with no cache (the first read of the store), warm, after one record
appended to the newest release's smoke file, to an older release's, to a DCP file, after
``specwatch import`` of three records, and ``specwatch results``. Each command runs in a child
process; the table gives its wall seconds and the peak resident memory of its largest process.
Usage: ``python scripts/store_scale.py [--copies 72] [--repeats 3] [--keep DIR]``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from synth_store import synth_line, synth_store  # noqa: E402

MEASURE = (
    "import resource, subprocess, sys; rc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL).returncode; "
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, rc)"
)
"""Runs a command and prints the peak RSS (KB) of its largest process and its exit code."""


def timed(cmd: list[str]) -> tuple[float, float]:
    """(wall seconds, peak RSS in GB) of ``cmd``; exits with its stderr if it fails."""
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", MEASURE, *cmd], capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - t
    rss_kb, rc = out.stdout.split()
    if rc != "0":
        raise SystemExit(f"store_scale: {' '.join(cmd)} exited {rc}: {out.stderr.strip()[-500:]}")
    return wall, int(rss_kb) / 1e6


def append_copy(store: Path, rel: str, k: int) -> None:
    """Append copy ``k`` of the first record of ``store/rel`` (a new case id) to that file."""
    path = store / rel
    first = json.loads(path.open().readline())
    with open(path, "a") as f:
        f.write(json.dumps(synth_line(first, k)) + "\n")


def import_copies(store: Path, rel: str, k: int, tmp: Path) -> list[str]:
    """A file of three new copies of ``rel``'s first records, and the command importing it."""
    lines = (store / rel).read_text().splitlines()[:3]
    src = tmp / f"import-{k}.jsonl"
    src.write_text("".join(json.dumps(synth_line(json.loads(x), k + i)) + "\n" for i, x in enumerate(lines)))
    return [sys.executable, "-m", "specwatch.cli", "import", str(src), "--results", str(store)]


def newest(store: Path, name: str) -> str:
    """The file ``name`` of the newest SGLang release that has one, relative to ``store``."""
    found = sorted(store.glob(f"*/sglang-*/{name}"), key=lambda p: tuple(int(x) for x in p.parent.name[7:].split(".")))
    return str(found[-1].relative_to(store))


def main() -> None:
    """Long because it is the measurement's script: every scenario in order, then the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--copies", type=int, default=72, help="copies of each committed record (72: about 100k)")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each warm or append scenario")
    ap.add_argument("--keep", type=Path, help="build the store here and keep it (default: a temporary folder)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="specwatch-scale-"))
    store = args.keep or tmp / "store"
    records = synth_store(args.copies, store, ROOT / "results")
    for extra in [ROOT / "results" / "noise-budgets.json", *(ROOT / "results").glob("*/*/runs.ndjson")]:
        dest = store / extra.relative_to(ROOT / "results")
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(extra, dest)
    dash = [sys.executable, "-m", "specwatch.cli", "dashboard", "--results", str(store), "--out", str(tmp / "out")]
    smoke_new, smoke_old = newest(store, "smoke.jsonl"), "nvidia-h200-x1/sglang-0.5.17/smoke.jsonl"
    dcp = newest(store, "dcp.jsonl")
    rows: list[tuple[str, list[tuple[float, float]]]] = [("dashboard, no cache", [timed(dash)])]
    rows.append(("dashboard, warm", [timed(dash) for _ in range(args.repeats)]))
    for label, rel, base in (
        (f"dashboard after one record appended to {smoke_new}", smoke_new, 50_000),
        (f"dashboard after one record appended to {smoke_old}", smoke_old, 60_000),
        (f"dashboard after one record appended to {dcp}", dcp, 70_000),
    ):
        runs = []
        for i in range(args.repeats):
            append_copy(store, rel, base + i)
            runs.append(timed(dash))
        rows.append((label, runs))
    runs = []
    for i in range(args.repeats):
        timed(import_copies(store, smoke_new, 80_000 + 10 * i, tmp))
        runs.append(timed(dash))
    rows.append((f"dashboard after `specwatch import` of 3 records into {smoke_new}", runs))
    rows.append(("`specwatch results`", [timed([sys.executable, "-m", "specwatch.cli", "results", str(store)])]))
    print(f"Store: {records} records ({args.copies} copies of the committed results)\n")
    print("| command | wall s | peak RSS GB |\n| --- | --- | --- |")
    for label, runs in rows:
        walls = ", ".join(f"{w:.1f}" for w, _ in runs)
        print(f"| {label} | {walls} | {max(r for _, r in runs):.2f} |")
    shutil.rmtree(tmp, ignore_errors=True)  # the store too, unless --keep put it elsewhere


if __name__ == "__main__":
    main()
