"""A report whose head ran a planted slowdown says, per decode metric, whether it called it, missed
it, or could not (below the floor)."""

import pytest

from specwatch.analysis.compare import Row, Verdict
from specwatch.analysis.floor import DetectionFloor
from specwatch.analysis.planted import planted_lines, planted_of, planted_table

CLASS = "tiny/bs16"


def _row(metric, base, head, verdict=Verdict.unchanged, timed=True, case="c1"):
    return Row(case, "tiny bs16", metric, base, head, "ms", verdict, timed=timed, noise_class=CLASS)


FLOOR = DetectionFloor(
    threshold=0.02, floors={f"{CLASS}/sglang_step_time_p10": 0.041, f"{CLASS}/output_throughput": 0.336}
)


def test_each_decode_metric_is_called_missed_or_below_the_floor():
    rows = [
        _row("sglang_step_time_p10", 2.93, 3.08, Verdict.regressed),  # 150 us of 2.93 ms = 5.1% > 4.1%: called
        _row("step_time", 3.63, 3.70),  # 4.1% > the 2% threshold, unchanged: missed
        _row("output_throughput", 17000.0, 16500.0),  # over the p10 step: 5.1% < 33.6%
        # 150 us of 10 ms = 1.5% < 2%, yet the measured change beat the budget: called, not "below the floor"
        _row("sglang_step_time", 10.0, 10.5, Verdict.regressed),
        _row("accept_length", 4.0, 4.0, timed=False),  # not a decode timing
        _row("wall_time", 1.0, 1.1, Verdict.regressed),  # timed, but not among the decode metrics
    ]
    planted = planted_of("slow-verify-gpu-150us", "head")
    assert planted.micros == 150 and planted.kind == "GPU time" and planted.expected is Verdict.regressed
    table = planted_table(rows, FLOOR, planted)
    got = {t.row.metric: (round(t.share, 4), t.budget, t.reading.value) for t in table}
    assert got == {
        "sglang_step_time_p10": (round(0.15 / 2.93, 4), 0.041, "called"),
        "step_time": (round(0.15 / 3.63, 4), 0.02, "missed"),
        "output_throughput": (round(0.15 / 2.93, 4), 0.336, "below the floor"),
        "sglang_step_time": (0.015, 0.02, "called"),
    }
    lines = planted_lines(rows, FLOOR, None, "slow-verify-gpu-150us")
    assert lines[0].startswith("Planted slowdown `slow-verify-gpu-150us` in head: 150 µs of GPU time")
    assert "2 called it, 1 missed it above their budget, 1 could not" in lines[0]
    assert "Host time can cost nothing" not in lines[0]
    assert any(
        "| output_throughput | 5.1% of 2.93 ms (sglang_step_time_p10) | 33.6% | unchanged | below the floor |" in x
        for x in lines
    )


def test_a_host_stall_in_the_base_is_called_by_an_improvement_and_null_or_other_faults_give_nothing():
    rows = [_row("sglang_step_time_p10", 3.08, 2.93, Verdict.improved), _row("step_time", 3.70, 3.63)]
    lines = planted_lines(rows, FLOOR, "slow-verify-150us", None)
    assert "in base: 150 µs of host time" in lines[0] and "1 called it, 1 missed it" in lines[0]
    assert "Host time can cost nothing where the GPU bounds the step" in lines[0]
    # the clean side is the head here: the share is over its step
    assert planted_table(rows, FLOOR, planted_of("slow-verify-150us", "base"))[0].share == pytest.approx(0.15 / 2.93)
    for fault in ("slow-verify-0us", "slow-verify-gpu-0us", "unaligned-watermark", None):
        assert planted_of(fault, "head") is None and planted_lines(rows, FLOOR, None, fault) == []


def test_compare_prints_the_planted_section_for_a_fault_pass(tmp_path):
    from typer.testing import CliRunner

    from records import case, record
    from specwatch.cli import app
    from specwatch.core.case import ModelSize
    from specwatch.core.record import Metric
    from specwatch.store.jsonl import append_record

    c = case(model=ModelSize.tiny, batch_size=16, topk=1)
    for run, fault, p10 in (("pa", None, 2.93), ("pb", "slow-verify-gpu-150us", 3.09)):
        r = record(c, run_id=run, fault=fault)
        r.suite = "timing"
        samples = [p10 * (1 + 0.002 * k) for k in range(6)]
        r.metrics["sglang_step_time_p10"] = Metric(
            value=p10, unit="ms", samples=samples, higher_is_better=False, engine_medians=samples[:3]
        )
        append_record(
            tmp_path / "m" / "sglang-0.5.17" / ("timing.jsonl" if fault is None else f"timing+fault-{fault}.jsonl"), r
        )
    res = CliRunner().invoke(
        app,
        [
            "compare",
            "suite=timing,run=pa",
            "suite=timing,run=pb,fault=slow-verify-gpu-150us",
            "--results",
            str(tmp_path),
        ],
    )
    assert "Planted slowdown `slow-verify-gpu-150us` in head: 150 µs of GPU time per verify step" in res.output, (
        res.output
    )
    assert "| sglang_step_time_p10 | 5.1% of 2.93 ms (sglang_step_time_p10) |" in res.output
