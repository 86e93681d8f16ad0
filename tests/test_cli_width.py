"""Every table the CLI prints stays readable at 100 columns: no line longer, no header or cell cut to "…"."""

import pytest
from typer.testing import CliRunner

from conftest import SUITES
from specwatch.cli import app

runner = CliRunner()
REPO = SUITES.parent


def at_100(monkeypatch, args) -> str:
    monkeypatch.setenv("COLUMNS", "100")
    res = runner.invoke(app, [str(a) for a in args])
    assert res.exit_code in (0, 1), res.output
    lines = res.stdout.splitlines()
    assert lines and max(len(x) for x in lines) <= 100, max(lines, key=len)
    assert "…" not in res.stdout
    return res.stdout


@pytest.mark.parametrize("suite", sorted(p.name for p in SUITES.glob("*.toml") if p.name != "byo-oracle.toml"))
def test_plan_fits_100_columns(monkeypatch, suite):
    out = at_100(monkeypatch, ["plan", SUITES / suite])
    assert "case id" in out  # the id column keeps its header


def test_plan_says_shared_parameters_and_skip_reasons_once(monkeypatch):
    out = at_100(monkeypatch, ["plan", SUITES / "dcp.toml"])
    assert "every case: " in out and "skip #1: " in out
    assert sum("skip #1:" in line for line in out.splitlines()) == 1


def test_results_on_the_committed_store_fit_100_columns(monkeypatch):
    out = at_100(monkeypatch, ["results", REPO / "results"])
    # long headers give way to short keys, explained under the table
    assert "engine start breakdown" in out and "est = engine_start_time" in out


def test_noise_and_holdout_fit_100_columns(monkeypatch):
    out = at_100(monkeypatch, ["noise-holdout", REPO / "results" / "noise-budgets.json", "--results", REPO / "results"])
    assert "held out, clean pairs" in out


def test_overhead_and_inject_fit_100_columns(monkeypatch):
    assert "harness overhead" in at_100(monkeypatch, ["overhead", "--results", REPO / "results"])
    assert "row-widen-revert" in at_100(monkeypatch, ["inject"])


def test_roofline_fits_100_columns(monkeypatch):
    at_100(monkeypatch, ["roofline", REPO / "results"])


@pytest.mark.sglang
def test_model_memory_and_simulate_fit_100_columns(monkeypatch):
    assert "alloc_len_per_decode" in at_100(monkeypatch, ["model", "memory", "--page", "64", "--topk", "8"])
    out = at_100(monkeypatch, ["model", "simulate", "--page", "64", "--topk", "8"])
    assert "quantity" in out and "value" in out


def test_fitted_table_keeps_every_value_whole_or_folded():
    """A table far wider than the console: headers become keys with a legend, values fold."""
    import pandas as pd

    from specwatch.commands import output as cli

    long = "x" * 150
    df = pd.DataFrame([{"a long header name": 1, "another long header": "two words", "text": long}])
    cli.console.width = 60
    try:
        with cli.console.capture() as cap:
            cli.print_frame("t", df)
    finally:
        cli.console.width = 260
    out = cap.get()
    assert max(len(x) for x in out.splitlines()) <= 60 and "…" not in out
    rows = [x for x in out.splitlines() if x.startswith("│")]
    assert "alh = a long header name" in out and "".join(rows).count("x") == 150
    assert rows[0].split("│")[1].strip() == "1" and "two" in rows[0]
