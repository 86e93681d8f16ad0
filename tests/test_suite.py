import pytest

from conftest import SUITES
from specwatch.core.case import Algorithm, Backend, Case, ModelSize
from specwatch.core.errors import SpecwatchInputError
from specwatch.suite import load_suite


def write(tmp_path, text, name="s.toml"):
    p = tmp_path / name
    p.write_text(text)
    return p


BASE = """
[suite]
name = "t"
[[matrix]]
attention_backend = ["triton"]
page_size = [1, 64]
topk = [1, 4]
"""


def test_shipped_suites_expand():
    counts = {}
    for name in ("smoke", "tree-page", "dcp"):
        plan = load_suite(SUITES / f"{name}.toml").plan()
        counts[name] = (len(plan), sum(p.skip is None for p in plan))
    # 2 backends x 2 pages x 2 topk, and a plain twin per backend x page
    assert counts["smoke"] == (8 + 4, 8 + 4)
    # 4 pages x 4 topk x 3 backends x 2 batch sizes x 2 profiles, and a twin per page x backend x batch
    assert counts["tree-page"] == (192 + 24, 192 + 24)
    # 3 algos x 3 backends x 2 pages x 2 topk x 2 dcp x 2 workloads; NGRAM topk>1 page>1 off flashinfer
    assert counts["dcp"][0] == 144 + 64 + 48  # Llama (MHA) cases + the MLA matrix + tiny-attn
    # NGRAM tree on paged KV (8); FlashMLA page 1 and tree on paged KV (12); flashinfer MLA topk 4 (8)
    assert counts["dcp"][0] - counts["dcp"][1] == 8 + 12 + 8


def test_dcp_large_pairs_every_dcp_4_and_8_case_with_its_dcp1_twin():
    plan = load_suite(SUITES / "dcp-large.toml").plan()
    cases = {p.case.case_id: p.case for p in plan if p.skip is None}
    assert len(plan) == len(cases) == 40
    wide = [c for c in cases.values() if c.dcp > 1]
    assert {(c.tp, c.dcp) for c in wide} == {(4, 4), (8, 8)} and len(wide) == 20
    assert all(c.dcp_twin_id() in cases for c in wide)


def test_ngram_skip_reason_is_sglangs():
    plan = load_suite(SUITES / "dcp.toml").plan()
    skipped = [p for p in plan if p.skip and p.case.algorithm is Algorithm.NGRAM]
    assert len(skipped) == 8
    assert all(
        p.case.algorithm is Algorithm.NGRAM
        and p.case.page_size > 1
        and p.case.topk > 1
        and p.case.attention_backend is not Backend.flashinfer
        for p in skipped
    )
    assert "only supported for the 'flashinfer' backend" in skipped[0].skip


def test_dcp_must_divide_tp(tmp_path):
    plan = load_suite(write(tmp_path, BASE + "tp = [2]\ndcp = [3]\n")).plan()
    assert all("dcp_size=3 must divide tp_size=2" in p.skip for p in plan)


def test_draft_tokens_bound_by_tree(tmp_path):
    plan = load_suite(write(tmp_path, BASE.replace("topk = [1, 4]", "topk = [2]") + "num_draft_tokens = [8]\n")).plan()
    assert all("num_steps*topk+1=7" in p.skip for p in plan)


def test_topk1_normalizes_draft_tokens_and_lists_duplicate(tmp_path):
    plan = load_suite(
        write(
            tmp_path,
            BASE.replace("topk = [1, 4]", "topk = [1]").replace("page_size = [1, 64]", "page_size = [1]")
            + "num_draft_tokens = [4, 8]\n",
        )
    ).plan()
    assert len(plan) == 2
    assert plan[0].case.num_draft_tokens == 4 and plan[0].skip is None
    assert plan[1].duplicate and plan[1].case.case_id == plan[0].case.case_id
    assert "adjusts speculative_num_draft_tokens=8" in plan[1].skip


def test_case_id_is_stable():
    # Pinned: a change here orphans every stored result. Append new pins, never edit old ones.
    c = Case(
        model=ModelSize.tiny,
        algorithm=Algorithm.EAGLE,
        attention_backend=Backend.triton,
        page_size=64,
        topk=4,
        num_steps=3,
        num_draft_tokens=8,
        batch_size=1,
        input_len=128,
        output_len=256,
    )
    assert c.case_id == "b014b982811c"
    assert c.case_id == Case(**c.params()).case_id


@pytest.mark.parametrize(
    "text,field,msg",
    [
        (
            BASE.replace('"triton"', '"cutlass"'),
            "matrix[0].attention_backend[0]",
            "'triton', 'flashinfer', 'fa3' or 'flashmla'",
        ),
        (BASE + "bogus = [1]\n", "matrix[0].bogus", "Extra inputs are not permitted"),
        (BASE.replace("page_size = [1, 64]", "page_size = [0]"), "matrix[0].page_size[0]", ">= 1"),
        ('[suite]\nname = "t"\n', "matrix", "Field required"),
    ],
)
def test_bad_suite_names_file_and_field(tmp_path, text, field, msg):
    p = write(tmp_path, text)
    with pytest.raises(SpecwatchInputError) as e:
        load_suite(p)
    line = str(e.value)
    assert line.startswith(f"{p}: {field}: ") and msg in line and "\n" not in line


def test_malformed_toml(tmp_path):
    p = write(tmp_path, "[suite\nname=")
    with pytest.raises(SpecwatchInputError, match="not valid TOML"):
        load_suite(p)


def test_context_limit_rule_matches_sglangs_refusal():
    from conftest import ROOT
    from specwatch.store.jsonl import load_records, result_files

    plan = {p.case.case_id: p for p in load_suite(SUITES / "context-limit.toml").plan()}
    refused = [r for r in load_records(result_files(ROOT / "results")) if r.suite == "context-limit"]
    assert refused, "the H200 records of SGLang refusing the too-long prompts are committed"
    for r in refused:
        # SGLang's own words (recorded on the GPU) and the plan's skip reason agree
        assert r.status.value == "failed"
        assert "You requested a total of 8215 tokens: 7824 tokens from the input" in r.reason
        assert "You requested a total of 8215 tokens: 7824 tokens from the input" in plan[r.case_id].skip
    runnable = [p for p in plan.values() if p.skip is None]
    assert {p.case.input_len for p in runnable} == {7776}


def test_every_shipped_suite_loads_and_the_profiles_suite_covers_the_imperfect_profiles():
    from specwatch.core.case import Profile

    for path in sorted(SUITES.glob("*.toml")):
        if path.name != "byo-oracle.toml":  # its checkpoints are written first (test_own_model)
            assert load_suite(path).plan(), path.name
    plan = load_suite(SUITES / "profiles.toml").plan()
    assert {p.case.profile for p in plan} == {Profile.q01, Profile.q03, Profile.random}
    assert all(p.skip is None for p in plan) and {p.case.topk for p in plan} == {1, 4}


def test_where_case_id_selects_exactly_the_named_cases():
    from specwatch.suite import matches, parse_where

    cases = [p.case for p in load_suite(SUITES / "smoke.toml").plan()]
    picked = {cases[0].case_id, cases[2].case_id}
    where = parse_where([f"case_id={','.join(sorted(picked))}"])
    assert {c.case_id for c in cases if matches(c, where)} == picked
    with pytest.raises(SpecwatchInputError, match="case_id"):
        parse_where(["case=abc"])


@pytest.mark.parametrize(
    "line,field,got",
    [
        ("page_size = [true]", "matrix[0].page_size[0]", "True"),
        ('page_size = ["64"]', "matrix[0].page_size[0]", "'64'"),
        ("page_size = [8.0]", "matrix[0].page_size[0]", "8.0"),
        ('cuda_graph = ["yes"]', "matrix[0].cuda_graph[0]", "'yes'"),
        ("cuda_graph = [1]", "matrix[0].cuda_graph[0]", "1"),
        ("topk = [1.0]", "matrix[0].topk[0]", "1.0"),
    ],
)
def test_suite_values_are_strictly_typed(tmp_path, line, field, got):
    key = line.split(" ")[0]
    text = "\n".join(ln for ln in BASE.splitlines() if not ln.startswith(key + " ")) + "\n" + line + "\n"
    p = write(tmp_path, text)
    with pytest.raises(SpecwatchInputError) as e:
        load_suite(p)
    assert str(e.value).startswith(f"{p}: {field}: ") and f"(got {got})" in str(e.value)


@pytest.mark.parametrize("header", ['repeats = "3"', "warmup = 1", "timeout_s = 900.5", "name = 1"])
def test_suite_header_is_strictly_typed(tmp_path, header):
    text = (
        BASE.replace('name = "t"', header)
        if header.startswith("name")
        else BASE.replace('[suite]\nname = "t"', f'[suite]\nname = "t"\n{header}')
    )
    with pytest.raises(SpecwatchInputError, match=f"suite.{header.split()[0]}: "):
        load_suite(write(tmp_path, text))


@pytest.mark.parametrize(
    "key,value,reason",
    [
        ("page_size", 10**23, "chunked_prefill_size"),
        ("page_size", 8192, "<= 4096"),
        ("topk", 0, ">= 1"),
        ("num_steps", 0, ">= 1"),
        ("num_draft_tokens", 0, ">= 1"),
        ("batch_size", 0, ">= 1"),
        ("input_len", 8193, "context length"),
        ("output_len", 0, ">= 1"),
        ("tp", 0, ">= 1"),
        ("dcp", 65, "<= 64"),
    ],
)
def test_every_numeric_axis_is_bounded(tmp_path, key, value, reason):
    text = "\n".join(ln for ln in BASE.splitlines() if not ln.startswith(key + " ")) + f"\n{key} = [{value}]\n"
    with pytest.raises(SpecwatchInputError) as e:
        load_suite(write(tmp_path, text))
    assert f"matrix[0].{key}[0]: " in str(e.value) and "out of bounds" in str(e.value) and reason in str(e.value)


@pytest.mark.parametrize(
    "header,reason",
    [
        ("repeats = 1000000000", "<= 1000"),
        ("repeats = 0", ">= 1"),
        ("timeout_s = 0", ">= 10"),
        ("max_cases = 10000000", "<= 1000000"),
    ],
)
def test_header_numbers_are_bounded(tmp_path, header, reason):
    with pytest.raises(SpecwatchInputError, match=f"suite.{header.split()[0]}: .*{reason}"):
        load_suite(write(tmp_path, BASE.replace('name = "t"', f'name = "t"\n{header}')))


def test_a_huge_product_is_refused_from_the_axes_sizes_before_expanding(tmp_path):
    import time

    ten = "[" + ", ".join(str(i) for i in range(1, 11)) + "]"
    axes = "\n".join(f"{k} = {ten}" for k in ("batch_size", "input_len", "output_len", "num_steps", "tp", "dcp"))
    p = write(tmp_path, BASE + axes + "\n")
    t0 = time.monotonic()
    with pytest.raises(SpecwatchInputError) as e:
        load_suite(p)
    assert time.monotonic() - t0 < 5
    line = str(e.value)
    assert line.startswith(f"{p}: matrix: 4,000,000 cases > max_cases 100,000")
    assert "page_size 2 x topk 2 x num_steps 10 x tp 10 x dcp 10 x batch_size 10" in line and "\n" not in line


def test_max_cases_sets_the_limit_and_the_count_needs_no_expansion(tmp_path):
    from specwatch.suite import SuiteSpec

    p = write(tmp_path, BASE.replace('name = "t"', 'name = "t"\nmax_cases = 3'))
    with pytest.raises(SpecwatchInputError, match="4 cases > max_cases 3"):
        load_suite(p)
    s = load_suite(write(tmp_path, BASE.replace('name = "t"', 'name = "t"\nmax_cases = 4'), "ok.toml"))
    assert s.case_count == 4 == len(s.plan())
    assert [p.case.case_id for p in s.iter_plan()] == [p.case.case_id for p in s.plan()]
    assert SuiteSpec.model_fields["matrix"] and s.spec.matrix[0].axis_sizes()["page_size"] == 2


@pytest.mark.parametrize("name", ["../../x", "/tmp/abs", "a/b", "", ".hidden", "a b", "-rf", "a+fault-x", "a" * 101])
def test_suite_name_must_be_one_plain_path_component(tmp_path, name):
    p = write(tmp_path, BASE.replace('name = "t"', f"name = {name!r}".replace("'", '"')))
    with pytest.raises(SpecwatchInputError) as e:
        load_suite(p)
    assert str(e.value).startswith(f"{p}: suite.name: ") and "plain name" in str(e.value)


def test_page_size_not_dividing_sglangs_prefill_chunk_is_planned_skipped(tmp_path):
    plan = load_suite(write(tmp_path, BASE.replace("page_size = [1, 64]", "page_size = [48, 64]"))).plan()
    by_page = {p.case.page_size: p.skip for p in plan if p.case.topk == 1}
    assert by_page[64] is None
    assert "chunked_prefill_size must be divisible by page_size" in by_page[48]
