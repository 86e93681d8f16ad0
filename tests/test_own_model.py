"""Own models and prompts: model tables by path, dataset prompts, the oracle tokenizer, parity."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import types
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import SUITES
from specwatch.cli import app
from specwatch.cli import main as cli_main
from specwatch.core.case import Algorithm, Backend, Case, Expectation, ModelSize, Profile
from specwatch.core.errors import SpecwatchInputError
from specwatch.oracle.shapes import FIRST_ACTIVE, SHAPES
from specwatch.own.prompts import PROMPTS_DIR_ENV, fetch_dataset, read_prompts
from specwatch.suite import load_suite

runner = CliRunner()
ORACLE_SUITES = sorted(p for p in SUITES.glob("*.toml") if p.name != "byo-oracle.toml")


@pytest.fixture(scope="module")
def oracle_models(tmp_path_factory) -> Path:
    """A folder holding ``oracle-models/`` as ``specwatch model write-oracle`` writes it (EAGLE)."""
    root = tmp_path_factory.mktemp("byo")
    res = runner.invoke(app, ["model", "write-oracle", str(root / "oracle-models")])
    assert res.exit_code == 0, res.output
    return root


def _suite(tmp_path: Path, model: str, extra: str = "", algorithm: str = "EAGLE") -> Path:
    p = tmp_path / "s.toml"
    p.write_text(
        f'[suite]\nname = "s"\n[[matrix]]\nmodel = [{model}]\nalgorithm = ["{algorithm}"]\n'
        f'attention_backend = ["triton"]\npage_size = [1]\ntopk = [1]\n{extra}'
    )
    return p


def _own(target: Path, draft: Path | None, name: str = "m") -> str:
    d = f', draft = "{draft}"' if draft else ""
    return f'{{name = "{name}", target = "{target}"{d}}}'


def test_oracle_cases_name_no_own_model_in_their_id_params():
    """The shipped plans themselves are pinned by test_speedup's plan digest."""
    assert all("own_model" not in pc.case.params() for p in ORACLE_SUITES[:2] for pc in load_suite(p).plan())


def test_the_shipped_byo_suite_plans_the_written_oracle_as_an_own_model(oracle_models, monkeypatch):
    monkeypatch.chdir(oracle_models)
    shutil.copytree(SUITES / "prompts", oracle_models / "suites" / "prompts", dirs_exist_ok=True)
    plan = load_suite(SUITES / "byo-oracle.toml").plan()
    runnable = [p for p in plan if p.skip is None and not p.twin]
    assert runnable and all(p.case.model is ModelSize.own for p in plan)
    c = runnable[0].case
    assert c.expectation is Expectation.parity and c.prompts.count == 24 and c.prompts.sha256
    assert c.own_model.context_len == SHAPES[ModelSize.tiny].max_position
    assert {p.case.own_model.name for p in runnable} == {"oracle-tiny", "oracle-tiny-ngram"}
    assert "oracle-tiny/EAGLE" in c.label()
    # [suite] speedup: the plain twins decode the target alone, so they run without a draft
    twins = [p for p in plan if p.twin]
    assert len(twins) == 9 and all(t.skip is None for t in twins)


def test_own_model_ids_join_across_folders_and_follow_the_configs(oracle_models, tmp_path):
    src = oracle_models / "oracle-models" / "tiny-seed0"
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        for role in ("target", "eagle-draft-perfect"):
            (d / role).mkdir(parents=True)
            for f in (src / role).glob("*.json"):
                shutil.copy(f, d / role / f.name)
    plan = {}
    for d in (a, b):
        s = load_suite(_suite(d, _own(d / "target", d / "eagle-draft-perfect")))
        plan[d] = s.plan()[0].case
    assert plan[a].case_id == plan[b].case_id  # same configs, other paths: the records join
    assert plan[a].own_model.target != plan[b].own_model.target
    assert str(a) not in json.dumps(plan[a].params())
    config = json.loads((b / "target" / "config.json").read_text())
    (b / "target" / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 3}))
    other = load_suite(_suite(b, _own(b / "target", b / "eagle-draft-perfect"))).plan()[0].case
    renamed = load_suite(_suite(a, _own(a / "target", a / "eagle-draft-perfect", "n"))).plan()[0].case
    assert len({plan[a].case_id, other.case_id, renamed.case_id}) == 3
    assert Case.model_validate(json.loads(plan[a].model_dump_json())).case_id == plan[a].case_id


@pytest.mark.parametrize(
    "model,field,words",
    [
        ('{name = "m", target = "no/such/dir"}', "matrix[0].model[0].target", "no such checkpoint folder"),
        ('{name = "m", target = "nobody-here/no-model"}', "matrix[0].model[0].target", "local Hugging Face cache"),
        ('{name = "tiny", target = "."}', "matrix[0].model[0].name", "oracle size"),
    ],
)
def test_a_missing_checkpoint_is_one_line_naming_suite_model_and_field(
    tmp_path, monkeypatch, capsys, model, field, words
):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    (tmp_path / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    path = _suite(tmp_path, model, algorithm="NGRAM")
    with pytest.raises(SystemExit) as e:
        cli_main(["plan", str(path)])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1, err
    assert str(path) in err and field in err and words in err


def test_a_draft_the_algorithm_needs_is_a_skip_and_ngram_runs_without_one(oracle_models, tmp_path):
    target = oracle_models / "oracle-models" / "tiny-seed0" / "target"
    plan = load_suite(_suite(tmp_path, _own(target, None))).plan()
    assert plan[0].skip.startswith("own-model-draft: EAGLE needs a draft")
    assert load_suite(_suite(tmp_path, _own(target, None), algorithm="NGRAM")).plan()[0].skip is None


@pytest.mark.parametrize(
    "model,extra,field",
    [
        ('"tiny"', 'prompts = "mt-bench"\n', "matrix[0].prompts"),
        ("OWN", 'profile = ["q=0.1"]\n', "matrix[0].profile"),
        ("OWN", 'prompts = "nonsense"\n', "matrix[0].prompts"),
        ("OWN", 'prompts = "gsm8k"\n', "matrix[0].prompts"),
        ("OWN", 'prompts = {file = "PROMPTS"}\nprompt_count = 25\n', "matrix[0].prompts"),
    ],
)
def test_bad_prompts_or_profiles_name_their_field(oracle_models, tmp_path, monkeypatch, model, extra, field):
    monkeypatch.setenv(PROMPTS_DIR_ENV, str(tmp_path / "empty"))
    target = oracle_models / "oracle-models" / "tiny-seed0" / "target"
    model = model.replace("OWN", _own(target, None))
    extra = extra.replace("PROMPTS", str(SUITES / "prompts" / "byo-24.jsonl"))
    with pytest.raises(SpecwatchInputError) as e:
        load_suite(_suite(tmp_path, model, extra, algorithm="NGRAM"))
    assert e.value.field == field


def test_datasets_are_read_from_the_prompts_folder_and_fetched_once_with_their_sha(
    oracle_models, tmp_path, monkeypatch
):
    folder = tmp_path / "prompts"
    rows = [{"question_id": i, "category": ["writing", "math"][i % 2], "turns": [f"q {i}", "again"]} for i in range(10)]
    body = "".join(json.dumps(r) + "\n" for r in rows).encode()
    calls = []

    class Resp:
        def __init__(self, url):
            calls.append(url)

        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False

        def read(self):
            return body

    path, sha = fetch_dataset("mt-bench", folder, opener=Resp)
    assert sha == hashlib.sha256(body).hexdigest() and (folder / "mt-bench.jsonl.sha256").read_text().startswith(sha)
    fetch_dataset("mt-bench", folder, opener=Resp)
    assert len(calls) == 1 and "mt_bench" in calls[0]
    assert [p.category for p in read_prompts(path, "mt-bench")][:2] == ["writing", "math"]
    monkeypatch.setenv(PROMPTS_DIR_ENV, str(folder))
    target = oracle_models / "oracle-models" / "tiny-seed0" / "target"
    extra = 'prompts = "mt-bench"\nprompt_count = 4\nprompt_seed = 3\n'
    case = load_suite(_suite(tmp_path, _own(target, None), extra, algorithm="NGRAM")).plan()[0].case
    assert case.prompts.source == "mt-bench" and case.prompts.sha256 == sha[:16]
    assert case.params()["prompts_sha"] == sha[:16]


def test_the_oracle_tokenizer_knows_every_shipped_prompt_and_ends_the_chat_on_an_active_token(oracle_models):
    from transformers import AutoTokenizer

    from specwatch.worker.own_model import encode

    tok = AutoTokenizer.from_pretrained(oracle_models / "oracle-models" / "tiny-seed0" / "target")
    prompts = read_prompts(SUITES / "prompts" / "byo-24.jsonl", "file")
    assert len(prompts) == 24 and {p.category for p in prompts} == {"writing", "math", "questions"}
    active = range(FIRST_ACTIVE, FIRST_ACTIVE + SHAPES[ModelSize.tiny].active)
    for p in prompts:
        ids = encode(tok, p.text)
        assert all(i in active for i in ids), (p.text, ids)
    assert tok.decode(encode(tok, "hello")[-2:]) == "assistant :"


def test_parity_counts_mismatches_and_the_first_differing_position():
    from specwatch.worker.parity import PlainRun, compare, parity_result, plain_kwargs

    assert compare([[1, 2, 3], [4, 5]], [[1, 2, 3], [4, 5]]) == (0, None, None)
    assert compare([[1, 2, 3], [4, 9, 8]], [[1, 2, 3], [4, 5, 6]]) == (2, 1, 1)
    assert compare([[1, 2]], [[1, 2, 3, 4]]) == (2, 0, 2)
    case = _own_case()
    metrics, checks, details = parity_result(case, [[1, 2]], PlainRun(outputs={case.case_id: [[1, 3]]}))
    assert checks == {"parity_with_plain": False} and metrics["parity_first_diff"][0] == 1
    assert details["parity"]["first_diff"] == {"prompt": 0, "position": 1}
    _, checks, details = parity_result(case, [[1, 2]], PlainRun(reason="plain engine: OOM"))
    assert checks == {} and details["parity"] == {"status": "not_run", "reason": "plain engine: OOM"}
    assert plain_kwargs({"model_path": "t", "speculative_algorithm": "EAGLE", "speculative_num_steps": 3}) == {
        "model_path": "t"
    }


def _own_case(**kw) -> Case:
    from specwatch.core.case import OwnModel, PromptSet

    own = OwnModel(name="m", config_sha="0" * 16, target="t", draft="d", context_len=8192)
    prompts = PromptSet(source="file", count=24, file=str(SUITES / "prompts" / "byo-24.jsonl"), sha256="1" * 16)
    base = dict(
        model=ModelSize.own,
        own_model=own,
        prompts=prompts,
        algorithm=Algorithm.EAGLE,
        attention_backend=Backend.triton,
        page_size=1,
        topk=1,
        num_steps=3,
        num_draft_tokens=4,
        batch_size=8,
        input_len=128,
        output_len=16,
    )
    return Case(**{**base, **kw})


def test_own_models_engine_arguments_carry_their_dtype_and_a_pool_sized_from_the_case():
    from specwatch.worker.engine_args import engine_kwargs
    from specwatch.worker.near_full import OWN_KV_TOKENS_MIN

    kw = engine_kwargs(_own_case(), Path("/t"), Path("/d"), 8)
    assert kw["dtype"] == "bfloat16" and kw["speculative_draft_model_path"] == "/d"
    # a fixed pool, not 70% of the GPU: two such engines share one GPU under --parallel-starts
    assert kw["max_total_tokens"] == OWN_KV_TOKENS_MIN
    long = engine_kwargs(_own_case(batch_size=16, input_len=7000, output_len=192), Path("/t"), Path("/d"), 16)
    assert long["max_total_tokens"] == 1 << 18  # 2 x 16 x (7000 + 192 + 4) = 230,272, rounded up to a power of two
    # an engine group's pool is its largest case's: the batch-16 case shares the batch-1 case's engine
    from specwatch.worker.near_full import kv_pool_tokens

    group = [
        _own_case(batch_size=1, input_len=7000, output_len=192),
        _own_case(batch_size=16, input_len=7000, output_len=192),
    ]
    assert kv_pool_tokens(group) == 1 << 18
    with pytest.raises(ValueError, match="own_model"):
        Case(**{**_own_case().model_dump(exclude={"own_model", "prompts"}), "model": ModelSize.own})


class ChainEngine:
    """Greedy continuation of the oracle chain from each prompt's last token; ``flip`` changes the
    token at that output position (a speculative engine that is not lossless)."""

    def __init__(self, flip: int | None = None, accept: float = 3.0):
        from specwatch.oracle.predict import Oracle

        self.oracle, self.flip, self.accept, self.kwargs = (
            Oracle(SHAPES[ModelSize.tiny], 0, Profile.perfect),
            flip,
            accept,
            None,
        )

    def generate(self, input_ids, sampling_params):
        n, outs = sampling_params["max_new_tokens"], []
        for p in input_ids:
            chain = self.oracle.chain(p[-1] - FIRST_ACTIVE, n + 1)[1:]
            if self.flip is not None:
                chain[self.flip] += 1
            meta = {"spec_accept_length": self.accept + (p[0] % 2), "spec_accept_rate": 0.5, "spec_verify_ct": 4}
            outs.append({"output_ids": chain, "meta_info": meta})
        return outs

    def flush_cache(self):
        return True

    def shutdown(self):
        pass


def test_an_own_case_measures_acceptance_by_category_and_checks_parity(oracle_models, monkeypatch):
    from specwatch.worker import own_model
    from specwatch.worker.parity import plain_outputs

    target = oracle_models / "oracle-models" / "tiny-seed0" / "target"
    case = _own_case(own_model=_own_case().own_model.model_copy(update={"target": str(target)}))
    prompts = lambda c: own_model.case_prompts(c)[0]  # noqa: E731
    plain = plain_outputs(lambda **kw: ChainEngine(accept=1.0), {"model_path": str(target)}, [case], prompts)
    assert plain.reason is None and len(plain.outputs[case.case_id]) == 24
    res = own_model.run_own_case(ChainEngine(), case, repeats=2, warmup=True, plain=plain)
    assert res["checks"] == {"parity_with_plain": True} and res["metrics"]["parity_mismatches"]["value"] == 0
    assert "parity_first_diff" not in res["metrics"] and res["metrics"]["accept_length"]["expected"] is None
    cats = res["details"]["accept_by_category"]
    assert set(cats) == {"writing", "math", "questions"} and all(v["requests"] == 16 for v in cats.values())
    assert res["details"]["expectation"] == "parity" and res["details"]["parity"]["prompts"] == 24
    bad = own_model.run_own_case(ChainEngine(flip=5), case, repeats=1, warmup=False, plain=plain)
    assert bad["checks"] == {"parity_with_plain": False} and bad["metrics"]["parity_first_diff"]["value"] == 5
    assert bad["metrics"]["parity_mismatches"]["value"] == 24


def test_worker_main_runs_the_plain_engine_before_the_speculative_one(oracle_models, tmp_path, monkeypatch):
    from specwatch.worker import main as worker_main

    target = oracle_models / "oracle-models" / "tiny-seed0" / "target"
    draft = target.parent / "eagle-draft-perfect"
    own = _own_case().own_model.model_copy(update={"target": str(target), "draft": str(draft)})
    case = _own_case(own_model=own)
    started = []

    class Engine(ChainEngine):
        def __init__(self, **kw):
            started.append(kw)
            super().__init__()

        def get_server_info(self):
            return {"internal_states": [{}], "version": "0.5.17"}

    monkeypatch.setitem(sys.modules, "sglang", types.SimpleNamespace(Engine=Engine))
    monkeypatch.setattr(worker_main, "case_models", lambda *a, **k: pytest.fail("own models are never written"))
    out, spec = tmp_path / "out.jsonl", tmp_path / "spec.json"
    spec.write_text(
        json.dumps(
            {
                "cases": [json.loads(case.model_dump_json())],
                "repeats": 1,
                "warmup": False,
                "models_dir": str(tmp_path),
                "probe": False,
                "results": str(out),
            }
        )
    )
    assert worker_main.main(str(spec)) == 0
    rec = [json.loads(x) for x in out.read_text().splitlines()][-1]
    assert rec["status"] == "ok", rec.get("log_tail")
    assert rec["checks"]["parity_with_plain"] and rec["details"]["parity"]["status"] == "compared"
    assert [("speculative_algorithm" in kw) for kw in started] == [False, True]
    assert started[1]["model_path"] == str(target) and started[1]["speculative_draft_model_path"] == str(draft)


def test_the_fake_worker_records_an_own_model_suite_under_its_stable_ids(oracle_models, tmp_path, monkeypatch):
    from specwatch.run.options import RunOptions
    from specwatch.run.runner import run_suite
    from specwatch.store.jsonl import load_records

    monkeypatch.chdir(oracle_models)
    shutil.copytree(SUITES / "prompts", oracle_models / "suites" / "prompts", dirs_exist_ok=True)
    suite = load_suite(SUITES / "byo-oracle.toml")
    here = str(Path(__file__).parent)
    env = {"PYTHONPATH": here + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = run_suite(suite, tmp_path / "results", RunOptions(gpus=1, worker_module="fake_worker", extra_env=env))
    recs = list(load_records([out]))
    planned = {p.case.case_id for p in suite.plan() if p.skip is None and p.case.topk != 4}  # topk 4: it dies
    assert planned and {r.case_id for r in recs if r.status.value == "ok"} == planned
    assert all(r.case.own_model.name.startswith("oracle-tiny") for r in recs)


def test_where_model_selects_an_own_model_by_its_name(oracle_models, monkeypatch):
    from specwatch.suite import parse_where, selected

    monkeypatch.chdir(oracle_models)
    shutil.copytree(SUITES / "prompts", oracle_models / "suites" / "prompts", dirs_exist_ok=True)
    plan = load_suite(SUITES / "byo-oracle.toml").plan()
    picked = selected(plan, parse_where(["model=oracle-tiny-ngram"]))
    assert {p.case.algorithm.value for p in picked} == {"NGRAM", "NONE"} and len(picked) == 2  # and its twin
    assert all(p.case.own_model.name == "oracle-tiny-ngram" for p in picked)
    assert len(selected(plan, parse_where(["model=tiny"]))) == 0  # no oracle-size case in this suite
    with pytest.raises(SpecwatchInputError):
        parse_where(["model=no spaces"])
