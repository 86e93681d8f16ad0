"""``worker.cpu_readings``: the scheduler's CPU seconds and the host's steal time around each timed
repeat, read from a ``/proc`` the test writes, and from this host's own."""

import os
import sys

import pytest

from specwatch.worker import cpu_readings
from specwatch.worker.cpu_readings import CpuReader, process_cpu_s, scheduler_of, steal_s
from specwatch.worker.windows import RepeatLoop, RepeatPlan

TICK = cpu_readings._ticks()


def _proc(root, pid: int, utime: int, stime: int, steal: dict) -> None:
    (root / str(pid)).mkdir(parents=True, exist_ok=True)
    # the command name may hold spaces and parentheses: fields are counted after the last ')'
    (root / str(pid) / "stat").write_text(f"{pid} (sglang::sch (1)) S 1 1 1 0 -1 0 0 0 0 0 {utime} {stime} 0 0\n")
    lines = [f"{name} 10 0 5 100 0 0 0 {v} 0 0" for name, v in steal.items()]
    (root / "stat").write_text("\n".join(lines) + "\nintr 0\n")


def test_cpu_and_steal_seconds_parse_proc_fields(tmp_path):
    _proc(tmp_path, 42, utime=250, stime=50, steal={"cpu": 40, "cpu0": 10, "cpu3": 30})
    assert process_cpu_s(42, tmp_path) == pytest.approx(300 / TICK)
    assert steal_s(None, tmp_path) == pytest.approx(40 / TICK)
    assert steal_s(3, tmp_path) == pytest.approx(30 / TICK)
    assert steal_s(7, tmp_path) is None and process_cpu_s(43, tmp_path) is None


def test_each_repeat_gets_its_scheduler_cpu_and_steal_deltas(tmp_path, monkeypatch):
    clock = {"t": 0.0}
    monkeypatch.setattr(cpu_readings.time, "perf_counter", lambda: clock["t"])
    reader = CpuReader(42, [3, 5], tmp_path)  # steal summed over its cores
    ticks = iter([(100, 10, 5, 7), (180, 10, 25, 40), (180, 12, 25, 41), (300, 20, 25, 42)])

    def batch() -> float:
        u, s, core, host = next(ticks)
        _proc(tmp_path, 42, u, s, {"cpu": host, "cpu3": core, "cpu5": core // 5})
        clock["t"] += 1.0
        return 1.0

    _proc(tmp_path, 42, 0, 0, {"cpu": 0, "cpu3": 0, "cpu5": 0})
    loop = RepeatLoop(RepeatPlan(repeats=2, min_timed_s=2.0))
    tps: list[float] = []

    def samples() -> list[float]:
        while len(tps) < len(loop.batches):
            tps.append(1.0)
        return tps

    # one batch reads the start state of the next: write the state each batch leaves behind
    loop.run(batch, samples, None, reader)
    assert loop.batches == [2, 2] and len(reader.repeats) == 2
    first, second = reader.repeats
    assert first["span_s"] == 2.0 and first["scheduler_cpu_s"] == pytest.approx(190 / TICK, abs=1e-4)
    assert first["core_steal_s"] == pytest.approx((25 + 5) / TICK, abs=1e-4)
    assert first["host_steal_s"] == pytest.approx(40 / TICK, abs=1e-4)
    assert second["scheduler_cpu_s"] == pytest.approx((320 - 190) / TICK, abs=1e-4)
    assert second["core_steal_s"] == 0.0 and second["host_steal_s"] == pytest.approx(2 / TICK, abs=1e-4)
    assert reader.details()["scheduler_pid"] == 42 and reader.details()["scheduler_cpus"] == [3, 5]


def test_the_scheduler_comes_from_the_pinning_and_no_scheduler_reads_steal_only(tmp_path):
    pinning = {
        "processes": [{"pid": 7, "role": "detokenizer", "cpus": [2]}, {"pid": 9, "role": "scheduler", "cpus": [1, 3]}]
    }
    assert scheduler_of(pinning) == (9, [1, 3])
    assert scheduler_of(None) == (None, None)  # this test process has no SGLang children
    _proc(tmp_path, 1, 0, 0, {"cpu": 4})
    reader = CpuReader(None, None, tmp_path)
    reader.begin()
    reader.end()
    (rep,) = reader.repeats
    assert rep["scheduler_cpu_s"] is None and rep["core_steal_s"] is None and rep["host_steal_s"] == 0.0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads Linux /proc")
def test_this_hosts_proc_gives_readings():
    sum(i * i for i in range(200_000))  # some CPU time of its own
    assert process_cpu_s(os.getpid()) > 0
    assert steal_s() is not None and steal_s(0) is not None
