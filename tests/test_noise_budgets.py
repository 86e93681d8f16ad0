import json

import pytest

from conftest import SUITES
from specwatch.analysis.noise import AAPair, BudgetFile
from specwatch.core.errors import SpecwatchInputError

COMMITTED = SUITES.parent / "results" / "noise-budgets.json"


def test_committed_budget_file_saves_back_byte_for_byte(tmp_path):
    BudgetFile.load(COMMITTED).save(tmp_path / "b.json")
    assert (tmp_path / "b.json").read_text() == COMMITTED.read_text()


def test_single_pair_file_reads_as_one_pair_and_merges_the_larger_budget(tmp_path):
    old = tmp_path / "old.json"
    old.write_text(
        json.dumps({"base": "a", "head": "b", "false_positive_rate": 1.0, "budgets": {"x/m": 0.2, "y/m": 0.9}})
    )
    f = BudgetFile.load(old)
    assert [(p.base, p.head) for p in f.pairs] == [("a", "b")]
    merged = f.merged(AAPair(base="c", head="d", margin=1.5), {"x/m": 0.3, "z/m": 0.1})
    assert merged.budgets == {"x/m": 0.3, "y/m": 0.9, "z/m": 0.1}
    merged.save(old)
    assert json.loads(old.read_text())["pairs"] == [
        {"base": "a", "head": "b", "false_positive_rate": 1.0},
        {"base": "c", "head": "d", "margin": 1.5},
    ]


def test_a_budget_file_keeps_the_smaller_threshold_its_pairs_were_measured_at(tmp_path):
    pair = AAPair(base="a", head="b")
    f = BudgetFile(pairs=[pair], budgets={}).merged(pair, {}, 0.02)
    assert f.threshold == 0.02 and f.merged(pair, {}, 0.05).threshold == 0.02
    assert BudgetFile(pairs=[], budgets={}).merged(pair, {}).threshold is None
    f.save(tmp_path / "t.json")
    assert BudgetFile.load(tmp_path / "t.json").threshold == 0.02
    assert "threshold" not in BudgetFile.load(COMMITTED).model_dump(exclude_none=True)


@pytest.mark.parametrize("text", ["[]", "{", '{"budgets": {"x": "big"}}'])
def test_not_a_budget_file_is_one_line_naming_it(tmp_path, text):
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    with pytest.raises(SpecwatchInputError) as e:
        BudgetFile.load(bad)
    assert str(e.value).startswith(f"{bad}: budgets: not a noise-budget file") and "\n" not in str(e.value)
