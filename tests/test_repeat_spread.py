"""The two loops' repeat spreads compared round by round: each probed engine start's repeats against
the plain-loop run of its round, pooled over the rounds into a verdict in the overhead table."""

import math
import statistics

import pytest

from records import case, rounds_record
from specwatch.core.case import ModelSize
from specwatch.store.repeat_spread import (
    SpreadVerdict,
    engine_repeats,
    log_sd,
    spread_round_ratios,
    spread_rounds_text,
    spread_verdict,
)

C = case(model=ModelSize.tiny, batch_size=16, topk=1)


def test_each_rounds_probed_repeats_are_read_against_that_rounds_plain_loop():
    # rounds 0 and 1: the probed repeats spread half the plain loop's, round 2 twice; the rounds'
    # own drift (100 -> 200 -> 400 tokens/s) never enters the ratios
    probed = [[99.0, 101.0], [198.0, 202.0], [392.0, 408.0]]
    plain = [[98.0, 102.0], [196.0, 204.0], [396.0, 404.0]]
    rec = rounds_record(C, probed, plain)
    assert engine_repeats(rec.details, rec.metrics["output_throughput"]) == probed
    got = spread_round_ratios(rec.details, rec.metrics)
    want = [log_sd(p) / log_sd(b) for p, b in zip(probed, plain)]
    assert got == pytest.approx(want) and got[0] == pytest.approx(0.5, rel=0.01)
    assert got[2] == pytest.approx(2.0, rel=0.01)


def test_rounds_that_cannot_be_read_are_left_out_and_a_record_without_counts_gives_nothing():
    probed = [[99.0, 101.0], [98.0, 102.0]]
    plain = [[98.0, 102.0], [99.0, 101.0]]
    # a plain loop served from the radix cache did less work: its round is not read
    assert spread_round_ratios(
        rounds_record(C, probed, plain, cached=[0, 64]).details, rounds_record(C, probed, plain).metrics
    ) == [pytest.approx(0.5, rel=0.01)]
    old = rounds_record(C, probed, plain)
    old.details.engine_starts["engines"][1].pop("timed_windows")  # made before starts kept their windows
    assert engine_repeats(old.details, old.metrics["output_throughput"]) is None
    assert spread_round_ratios(old.details, old.metrics) is None
    short = rounds_record(C, probed, plain)
    short.details.engine_starts["engines"][0]["timed_windows"]["repeats"] = 3  # counts past the samples
    assert spread_round_ratios(short.details, short.metrics) is None
    unpaired = rounds_record(C, probed, plain)
    unpaired.details.baseline["runs"].pop()
    assert spread_round_ratios(unpaired.details, unpaired.metrics) is None
    flat = rounds_record(C, [[100.0, 100.0], [99.0, 101.0]], plain)  # a start with no spread at all: not read
    assert spread_round_ratios(flat.details, flat.metrics) == [pytest.approx(1.0)]


def test_the_verdict_says_narrower_alike_or_wider_by_where_the_interval_lies():
    ratio, low, high, verdict = spread_verdict([0.66, 0.63, 0.79, 0.71])
    assert verdict is SpreadVerdict.narrower and high < 1
    assert ratio == pytest.approx(math.exp(statistics.fmean(math.log(x) for x in [0.66, 0.63, 0.79, 0.71])))
    assert spread_verdict([1.5, 1.6, 1.4])[3] is SpreadVerdict.wider
    assert spread_verdict([0.5, 1.5, 1.0])[3] is SpreadVerdict.alike
    assert spread_verdict([0.8]) is None
    assert spread_rounds_text([0.66, 0.63, 0.79, 0.71]).endswith("narrower; 4 rounds)")
    assert spread_rounds_text([0.81]) == "0.81x (one round)" and spread_rounds_text([]) == "not recorded"


def test_the_overhead_table_pools_the_rounds_spread_ratios_over_runs():
    from specwatch.analysis.overhead import baseline_overhead_table
    from specwatch.store.frame import records_frame

    plain = [[98.0, 102.0], [98.0, 102.0]]
    a = rounds_record(C, [[99.0, 101.0], [99.0, 101.0]], plain, "r1")
    b = rounds_record(C, [[99.0, 101.0]], plain[:1], "r2")
    (row,) = baseline_overhead_table(records_frame([a, b])).to_dict("records")
    cell = row["spread per round probed / plain"]
    assert cell.startswith("0.50x") and cell.endswith("narrower; 3 rounds)")
    old = rounds_record(C, [[99.0, 101.0], [99.0, 101.0]], plain, "r3")
    old.details.engine_starts["engines"][0].pop("timed_windows")
    (row,) = baseline_overhead_table(records_frame([old])).to_dict("records")
    assert row["spread per round probed / plain"] == "not recorded"
