"""DFLASH as a suite algorithm: the dflash suite's plan, SGLang's normalisation of topk and
num_steps, the validity rules, the engine arguments, the oracle's expectation and a fake-worker run."""

import json
import math
import os
from pathlib import Path

from conftest import SUITES, harness_suite
from specwatch.core.case import Algorithm, Backend, Case, ModelSize, Profile, Workload
from specwatch.core.record import Status
from specwatch.oracle.checkpoints import model_dirs
from specwatch.oracle.predict import Oracle
from specwatch.oracle.shapes import SHAPES
from specwatch.rules.validity import normalize_draft_tokens, skip_reason
from specwatch.run.runner import RunOptions, engine_groups, run_suite
from specwatch.store.jsonl import read_records
from specwatch.suite import load_suite
from specwatch.worker.engine_args import engine_kwargs

HERE = os.path.dirname(__file__)


def dflash_case(**kw) -> Case:
    base = dict(
        model=ModelSize.tiny,
        algorithm=Algorithm.DFLASH,
        attention_backend=Backend.triton,
        page_size=64,
        topk=1,
        num_steps=1,
        num_draft_tokens=16,
        batch_size=1,
        input_len=512,
        output_len=256,
    )
    return Case(**{**base, **kw})


def test_dflash_suite_plans_every_page_backend_and_block_in_few_engines():
    plan = load_suite(SUITES / "dflash.toml").plan()
    run = [p.case for p in plan if p.skip is None]
    assert 24 <= len(run) <= 45 and len(run) == len(plan)
    assert len(engine_groups(run)) <= 20
    assert {c.page_size for c in run} == {1, 16, 64, 256}
    assert {c.attention_backend for c in run} == {Backend.triton, Backend.flashinfer, Backend.fa3}
    assert {c.num_draft_tokens for c in run} == {4, 8, 16}
    assert {c.workload for c in run} == {Workload.standard, Workload.near_full}
    assert {(c.topk, c.num_steps) for c in run} == {(1, 1)}
    ctx = SHAPES[ModelSize.tiny].max_position
    assert {c.input_len + c.output_len for c in run if c.input_len > 7000} == {ctx - 2}
    assert {c.batch_size for c in run} == {1, 8}


def test_dflash_topk_and_steps_are_forced_to_one_in_sglangs_words(tmp_path):
    suite = harness_suite(tmp_path, topks="[1, 4]", draft=8, extra='algorithm = ["DFLASH"]\nnum_steps = [3]')
    plan = suite.plan()
    kept = [p for p in plan if not p.duplicate]
    assert {(p.case.topk, p.case.num_steps, p.case.num_draft_tokens) for p in plan} == {(1, 1, 8)}
    assert len(kept) == 4  # page 1/64 x batch 1/8; the topk-4 points are the same cases
    assert kept[0].adjusted == (
        "DFLASH only supports speculative_num_steps == 1; overriding speculative_num_steps=3 to 1.",
    )
    dup = next(p for p in plan if p.duplicate)
    assert "overriding speculative_eagle_topk=4 to 1." in dup.skip
    assert "overriding speculative_num_steps=3 to 1." in dup.skip


def test_block_size_is_not_rewritten_like_an_eagle_chain():
    assert normalize_draft_tokens(Algorithm.DFLASH, 1, 1, 16) == 16
    assert normalize_draft_tokens(Algorithm.EAGLE, 1, 3, 16) == 4


def test_validity_refuses_what_the_dflash_oracle_and_sglang_cannot_run():
    assert skip_reason(dflash_case()) is None
    assert skip_reason(dflash_case(profile=Profile.random)).startswith("dflash-oracle:")
    assert skip_reason(dflash_case(num_draft_tokens=32)).startswith("dflash-oracle:")
    assert skip_reason(dflash_case(input_len=8)).startswith("dflash-oracle:")
    assert skip_reason(dflash_case(model=ModelSize.tiny_mla)).startswith("mla-oracle:")
    heads = skip_reason(dflash_case(tp=3))
    assert heads == (
        "dflash-draft-heads: DFlashAttention requires total_num_heads divisible by tp_size. "
        "total_num_heads=128, tp_size=3."
    )
    ctx = SHAPES[ModelSize.tiny].max_position
    assert skip_reason(dflash_case(input_len=ctx - 258, output_len=256)) is None
    assert skip_reason(dflash_case(input_len=ctx - 257, output_len=256)).startswith("scheduler-clips-output:")


def test_engine_arguments_of_a_dflash_case():
    kw = engine_kwargs(dflash_case(num_steps=3, topk=4, num_draft_tokens=8), Path("/t"), Path("/d"), 8)
    assert kw["speculative_algorithm"] == "DFLASH"
    assert (kw["speculative_num_steps"], kw["speculative_eagle_topk"]) == (1, 1)
    assert kw["speculative_num_draft_tokens"] == 8
    assert kw["speculative_draft_model_path"] == "/d"


def test_dflash_draft_folder_names_its_block_size(tmp_path):
    _, d16 = model_dirs(tmp_path, ModelSize.tiny, Profile.perfect, Algorithm.DFLASH)
    _, d4 = model_dirs(tmp_path, ModelSize.tiny, Profile.perfect, Algorithm.DFLASH, block_size=4)
    assert d16.name == "dflash-draft-perfect-b16" and d4.name == "dflash-draft-perfect-b4"


def test_expected_dflash_acceptance_is_the_block_for_the_perfect_draft():
    o = Oracle(SHAPES[ModelSize.tiny], 0, Profile.perfect)
    first = o.chain(5, 1)[0]
    for block in (4, 8, 16):
        v = o.expected_case_verifies(Algorithm.DFLASH, first, 256, 1, 1, block)
        assert v == math.ceil(255 / block)
    assert o.expected_case_verifies(Algorithm.EAGLE, first, 256, 3, 1, 4) == math.ceil(255 / 4)
    worse = Oracle(SHAPES[ModelSize.tiny], 0, Profile.q03).expected_case_verifies(
        Algorithm.DFLASH, first, 256, 1, 1, 16
    )
    assert worse > math.ceil(255 / 16)
    none = Oracle(SHAPES[ModelSize.tiny], 0, Profile.second_choice).expected_case_verifies(
        Algorithm.DFLASH, first, 256, 1, 1, 16
    )
    assert none == 255


def test_fake_worker_runs_a_dflash_suite_end_to_end(tmp_path):
    suite = harness_suite(tmp_path, name="dflash-harness", topks="[1]", draft=16, extra='algorithm = ["DFLASH"]')
    env = {"PYTHONPATH": HERE + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = run_suite(suite, tmp_path / "results", RunOptions(gpus=1, worker_module="fake_worker", extra_env=env))
    recs = list(read_records(out))
    assert len(recs) == 4 and all(r.status is Status.ok for r in recs)
    assert {(r.case.algorithm, r.case.num_steps, r.case.topk, r.case.num_draft_tokens) for r in recs} == {
        (Algorithm.DFLASH, 1, 1, 16)
    }
    assert json.loads(out.read_text().splitlines()[0])["case"]["algorithm"] == "DFLASH"
