"""Core speed: how fast one fixed piece of pure-Python work runs on each logical CPU of this host.

The tiny oracle's decode loop is bound by SGLang's scheduler in Python (its CPU seconds equal each
timed window's wall time, ``details.timed_cpu``), so a core that runs Python slower than another,
or slower now than a minute ago, moves tiny's throughput with nothing of SGLang's changed. This
measures that directly, without SGLang or a GPU: the same loop pinned to each allowed CPU in turn
(``os.sched_setaffinity``), ``--repeats`` times per CPU, for ``--rounds`` passes over all CPUs, and
the host's steal seconds (``/proc/stat``) over the whole measurement.

Prints one JSON object: per CPU its seconds per repeat and median, the spread across CPUs of the
medians ((max - min) / median of medians), each CPU's repeat spread and round-to-round change,
the SMT sibling lists from sysfs, and the host's provenance. About 20 s on 16 CPUs.

    python scripts/core_speed.py [--repeats 5] [--rounds 2] [--out core-speed.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path


def work(n: int = 500_000) -> int:
    """Scheduler-like Python: dict and list traffic, attribute reads, small integer arithmetic."""

    class Req:
        __slots__ = ("rid", "tokens", "done")

        def __init__(self, rid: int):
            self.rid, self.tokens, self.done = rid, [], False

    reqs = {i: Req(i) for i in range(64)}
    total = 0
    for step in range(n):
        r = reqs[step & 63]
        r.tokens.append(step)
        if len(r.tokens) > 32:
            total += sum(r.tokens[-8:])
            r.tokens.clear()
        total ^= hash((r.rid, step)) & 0xFFFF
    return total


def steal_seconds() -> float:
    """The host's steal time from the first line of ``/proc/stat`` (0 where it is not reported)."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()
        return int(fields[8]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def siblings() -> dict[int, str]:
    """Each CPU's SMT sibling list as sysfs names it (``thread_siblings_list``)."""
    out = {}
    for cpu in sorted(os.sched_getaffinity(0)):
        p = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list")
        out[cpu] = p.read_text().strip() if p.exists() else ""
    return out


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def spread(values: list[float]) -> float:
    return (max(values) - min(values)) / statistics.median(values)


def measure(repeats: int, rounds: int) -> dict:
    allowed = sorted(os.sched_getaffinity(0))
    work(5_000)  # warm the interpreter's caches
    per_cpu: dict[int, list[list[float]]] = {cpu: [] for cpu in allowed}
    steal0 = steal_seconds()
    t0 = time.perf_counter()
    try:
        for _ in range(rounds):
            for cpu in allowed:
                os.sched_setaffinity(0, {cpu})
                work(20_000)  # settle on the new core
                times = []
                for _ in range(repeats):
                    t = time.perf_counter()
                    work()
                    times.append(time.perf_counter() - t)
                per_cpu[cpu].append(times)
    finally:
        os.sched_setaffinity(0, set(allowed))
    medians = {cpu: statistics.median(t for r in runs for t in r) for cpu, runs in per_cpu.items()}
    return {
        "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "cpu_model": cpu_model(),
        "python": platform.python_version(),
        "cpus": allowed,
        "smt_siblings": siblings(),
        "repeats": repeats,
        "rounds": rounds,
        "wall_s": round(time.perf_counter() - t0, 2),
        "steal_s": round(steal_seconds() - steal0, 3),
        "seconds": {cpu: [[round(t, 5) for t in r] for r in runs] for cpu, runs in per_cpu.items()},
        "median_s": {cpu: round(m, 5) for cpu, m in medians.items()},
        "spread_across_cpus": round(spread(list(medians.values())), 4),
        "slowest_over_fastest": round(max(medians.values()) / min(medians.values()), 4),
        "repeat_spread": {cpu: round(max(spread(r) for r in runs), 4) for cpu, runs in per_cpu.items()},
        "round_change": {
            cpu: round(statistics.median(runs[-1]) / statistics.median(runs[0]) - 1, 4) for cpu, runs in per_cpu.items()
        },
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    text = json.dumps(measure(args.repeats, args.rounds), indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
