"""The hardening harness's suite-level classes (bad suite files) against the real CLI: all handled."""

import importlib.util
import sys

from conftest import ROOT

spec = importlib.util.spec_from_file_location("hardening", ROOT / "scripts" / "hardening.py")
hardening = sys.modules["hardening"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(hardening)


def test_every_bad_suite_file_gets_one_line_naming_file_and_field_and_exit_2():
    trials = hardening.all_trials("suite:")
    assert len(trials) >= 114
    outcomes, faults = hardening.run_all("suite:", jobs=2, faults=False)
    assert not faults and len(outcomes) == len(trials)
    bad = [f"{o.klass} / {o.variant}: {o.why}" for o in outcomes if not o.handled]
    assert not bad, "\n".join(bad)


def test_bad_where_values_are_refused_by_the_cli():
    outcomes, _ = hardening.run_all("option: --where", jobs=2, faults=False)
    bad = [f"{o.variant}: {o.why}" for o in outcomes if not o.handled]
    assert len(outcomes) >= 8 and not bad, "\n".join(bad)


def test_the_judge_counts_a_lax_accept_a_traceback_and_a_wrapped_line_as_not_handled():
    assert hardening.judge(2, "", "error: s.toml: matrix[0].page_size[0]: bad\n", "s.toml") == (
        True,
        "error: s.toml: matrix[0].page_size[0]: bad",
    )
    assert not hardening.judge(0, "a table", "", "s.toml")[0]
    assert not hardening.judge(2, "", "Traceback (most recent call last):\n  x\nKeyError: 1\n", "s.toml")[0]
    assert not hardening.judge(2, "", "error: s.toml: a long line\nwrapped here\n", "s.toml")[0]
    assert not hardening.judge(2, "", "error: other.toml: bad\n", "s.toml")[0]
    assert not hardening.judge(2, "", "error: s.toml: bad\n", "s.toml", stray={"escape/x.jsonl"})[0]
