"""``scripts/core_speed.py``: one Python loop timed on each allowed CPU in turn, the process's own
affinity restored, the spreads computed from the timings it reports."""

import importlib.util
import json
import os
import statistics
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "core_speed.py"


def _script():
    spec = importlib.util.spec_from_file_location("core_speed", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_each_allowed_cpu_is_timed_and_the_affinity_is_restored(monkeypatch):
    mod = _script()
    monkeypatch.setattr(
        mod, "work", lambda n=0: sum(range(300_000))
    )  # a few ms: timings rounded to 10 µs stay exact to ~1%
    allowed = os.sched_getaffinity(0)
    out = mod.measure(repeats=3, rounds=2)
    assert os.sched_getaffinity(0) == allowed
    assert out["cpus"] == sorted(allowed) and set(out["seconds"]) == allowed
    assert all(len(runs) == 2 and all(len(r) == 3 for r in runs) for runs in out["seconds"].values())
    medians = {c: statistics.median(t for r in runs for t in r) for c, runs in out["seconds"].items()}
    assert out["slowest_over_fastest"] >= 1.0
    assert abs(out["slowest_over_fastest"] - max(medians.values()) / min(medians.values())) < 0.02
    json.dumps(out)  # the report is JSON


def test_spread_is_the_range_over_the_median():
    assert _script().spread([1.0, 2.0, 4.0]) == 1.5
