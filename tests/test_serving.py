"""The serving workload: SGLang's server command line, its serving benchmark's command line and
output, the suite, the release adapter, and a server that does not come up."""

import argparse
import json
import re
import sys
from pathlib import Path

import pytest

from conftest import ROOT, SUITES
from specwatch.core.case import SERVING_PROMPTS_DEFAULT, Algorithm, Backend, Case, ModelSize, Workload
from specwatch.core.errors import SpecwatchInputError
from specwatch.core.protocol import CaseLine, WorkerSpec
from specwatch.oracle.shapes import SHAPES
from specwatch.rules.release_serving import SERVING_BENCHMARKS, serving_benchmark_for
from specwatch.rules.releases import UnknownReleaseError, releases
from specwatch.rules.validity import skip_reason
from specwatch.suite import load_suite
from specwatch.worker import serving, serving_server
from specwatch.worker.engine_args import engine_kwargs
from specwatch.worker.serving_bench import OUTPUT_KEYS, bench_argv, parse_output, read_output
from specwatch.worker.serving_server import server_argv

FIXTURES = Path(__file__).parent / "fixtures" / "serving"
SOURCES = ROOT / ".cache" / "sglang-src"
BENCH_FILE = {"0.5.23": "benchmark/serving.py", "0.5.17": "benchmark/serving.py", "0.5.12": "bench_serving.py"}


def serving_case(**kw) -> Case:
    base = dict(
        model=ModelSize.tiny,
        algorithm=Algorithm.EAGLE,
        attention_backend=Backend.flashinfer,
        page_size=64,
        topk=4,
        num_steps=3,
        num_draft_tokens=8,
        batch_size=8,
        input_len=128,
        output_len=128,
        workload=Workload.serving,
    )
    return Case(**{**base, **kw})


def result_keys(version: str) -> list[str]:
    """The keys of the benchmark's ``result`` dict as the release's source writes them."""
    text = (SOURCES / version / "sglang" / BENCH_FILE[version]).read_text()
    block = re.search(r"\n        result = \{\n(.*?)\n        \}\n", text, re.S).group(1)
    return re.findall(r'^\s+"([a-z0-9_]+)":', block, re.M)


@pytest.mark.parametrize("version", ["0.5.23", "0.5.17"])
def test_benchmark_output_parses_into_latency_percentiles_throughput_and_acceptance(version):
    line = read_output(FIXTURES / f"bench-{version}.jsonl")
    res = parse_output([line], serving_case(serving_prompts=64))
    m = res["metrics"]
    assert (m["ttft_p50"]["value"], m["ttft_p90"]["value"], m["ttft_p99"]["value"]) == (19.6, 24.0, 30.0)
    assert (m["tpot_p50"]["value"], m["itl_p99"]["value"]) == (pytest.approx(3.626), pytest.approx(21.75))
    assert all(m[f"{k}_p{p}"]["unit"] == "ms" for k in ("ttft", "tpot", "itl") for p in (50, 90, 99))
    assert m["output_throughput"] == {
        "value": 1950.5,
        "unit": "tokens/s",
        "samples": [1950.5],
        "expected": None,
        "exact": False,
        "higher_is_better": True,
    }
    assert (m["request_throughput"]["unit"], m["completed_requests"]["value"]) == ("requests/s", 64.0)
    assert (m["accept_length"]["value"], m["accept_length"]["unit"]) == (3.91, "tokens/verify")
    assert res["checks"] == {"all_requests_completed": True, "output_tokens_as_requested": True}
    assert res["details"]["serving_keys_absent"] == []
    assert res["details"]["serving_runs"][0]["request_rate"] == "inf"  # JSON has no inf: kept as text
    CaseLine.model_validate({"case_id": "x", "status": "ok", **res})


def test_an_older_release_line_without_p90s_names_what_it_lacks():
    line = read_output(FIXTURES / "bench-0.5.12.jsonl")
    res = parse_output([line], serving_case())
    wanted = {k for k, _, _ in OUTPUT_KEYS.values()}
    assert set(res["details"]["serving_keys_absent"]) == set(serving_benchmark_for("0.5.12").absent_keys) & wanted
    assert "ttft_p90" not in res["metrics"] and "ttft_p99" in res["metrics"]


def test_requests_short_of_the_case_fail_the_completion_check_and_repeats_are_samples():
    line = read_output(FIXTURES / "bench-0.5.23.jsonl")
    short = {**line, "completed": 60, "total_output_tokens": 60 * 128, "output_throughput": 1000.0}
    res = parse_output([line, short, line], serving_case())
    assert res["checks"]["all_requests_completed"] is False
    assert res["metrics"]["output_throughput"]["samples"] == [1950.5, 1000.0, 1950.5]
    assert res["metrics"]["output_throughput"]["value"] == 1950.5


def test_acceptance_falls_back_to_the_server_and_a_plain_twin_has_none():
    line = {**read_output(FIXTURES / "bench-0.5.23.jsonl"), "accept_length": None}
    res = parse_output([line], serving_case(), fallback_accept=2.5)
    assert res["metrics"]["accept_length"]["value"] == 2.5
    assert "server_info" in res["details"]["accept_length_source"]
    plain = parse_output([line], serving_case().plain_twin(), fallback_accept=2.5)
    assert "accept_length" not in plain["metrics"]


@pytest.mark.parametrize("version", ["0.5.23", "0.5.17", "0.5.12"])
def test_fixtures_hold_exactly_the_keys_the_release_writes(version):
    if not (SOURCES / version).is_dir():
        pytest.skip(f"no SGLang {version} source here")
    assert list(json.loads((FIXTURES / f"bench-{version}.jsonl").read_text())) == result_keys(version)


def test_every_release_has_a_benchmark_module_whose_absent_keys_match_its_source():
    covered = [v for v in releases() if serving_benchmark_for(v)]
    assert covered == releases()
    assert (
        serving_benchmark_for("0.5.23").module == serving_benchmark_for("0.5.17").module == "sglang.benchmark.serving"
    )
    assert serving_benchmark_for("0.5.14").module == "sglang.bench_serving"
    with pytest.raises(UnknownReleaseError):
        serving_benchmark_for("0.4.0")
    wanted = {k for k, _, _ in OUTPUT_KEYS.values()}
    for b in SERVING_BENCHMARKS:
        for v in (b.first, b.last):
            if not (SOURCES / v).is_dir():
                continue
            text = (SOURCES / v / "sglang" / b.source).read_text()
            assert "--output-file" in text and '"random-ids"' in text, v
            block = re.search(r"\n        result = \{\n(.*?)\n        \}\n", text, re.S).group(1)
            keys = set(re.findall(r'^\s+"([a-z0-9_]+)":', block, re.M))
            assert wanted - keys == set(b.absent_keys) & wanted, v


def test_benchmark_command_line_uses_random_ids_and_flags_every_release_parses(tmp_path):
    c = serving_case(batch_size=8, serving_prompts=32)
    argv = bench_argv(
        c, "sglang.benchmark.serving", 31000, tmp_path / "t", tmp_path / "t", tmp_path / "o.jsonl", 2, True
    )
    assert argv[:3] == [sys.executable, "-m", "sglang.benchmark.serving"]
    opts = dict(zip(argv[3:], argv[4:]))
    assert opts["--dataset-name"] == "random-ids" and "--dataset-path" not in argv  # no ShareGPT download
    assert (opts["--num-prompts"], opts["--max-concurrency"], opts["--seed"]) == ("32", "8", "2")
    assert (opts["--random-input-len"], opts["--random-output-len"], opts["--random-range-ratio"]) == (
        "128",
        "128",
        "1.0",
    )
    assert opts["--output-file"] == str(tmp_path / "o.jsonl") and "--tokenize-prompt" in argv
    assert "--output-details" in argv  # each request's TTFT and text
    oracle = bench_argv(c, "m", 1, tmp_path, tmp_path, tmp_path / "o.jsonl", 0, True, dataset=tmp_path / "p.json")
    opts = dict(zip(oracle[3:], oracle[4:]))
    assert (opts["--dataset-name"], opts["--dataset-path"]) == ("random", str(tmp_path / "p.json"))
    argv = argv + ["--dataset-path"]
    for version, rel in BENCH_FILE.items():
        if (SOURCES / version).is_dir():
            text = (SOURCES / version / "sglang" / rel).read_text()
            for flag in (a for a in argv[3:] if a.startswith("--")):
                assert f'"{flag}"' in text, (version, flag)


def test_server_command_line_gives_the_offline_engines_arguments(tmp_path):
    c = serving_case()
    kw = engine_kwargs(c, tmp_path / "target", tmp_path / "draft", 8, 1 << 16)
    argv = server_argv({**kw, "nccl_port": 23456}, "127.0.0.1", 31000)
    assert argv[:3] == [sys.executable, "-m", "sglang.launch_server"]
    try:
        from specwatch.core.sglang_host import ensure_import_stubs

        ensure_import_stubs()
        from sglang.srt.server_args import ServerArgs
    except Exception as e:  # pragma: no cover - SGLang not importable here
        pytest.skip(f"SGLang not importable: {e}")
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    parsed = vars(parser.parse_args(argv[3:]))
    known = {k: v for k, v in kw.items() if k in parsed and k != "skip_tokenizer_init"}
    assert {k: parsed[k] for k in known} == known
    assert parsed["skip_tokenizer_init"] is False  # the benchmark reads the streamed text
    assert (parsed["port"], parsed["host"], parsed["nccl_port"]) == (31000, "127.0.0.1", 23456)


def test_a_false_flag_whose_default_is_true_has_no_command_line():
    with pytest.raises(serving_server.NoCliForm):
        server_argv({"enable_x": False}, "127.0.0.1", 1, defaults={"enable_x": True})
    assert "--enable-x" not in server_argv({"enable_x": False}, "127.0.0.1", 1, defaults={"enable_x": False})


def test_serving_suite_plans_spec_cases_and_their_plain_twins():
    plan = load_suite(SUITES / "serving.toml").plan()
    assert len(plan) == 24 and all(p.skip is None for p in plan)
    assert all(p.case.workload is Workload.serving and p.case.serving_requests == 64 for p in plan)
    twins = [p.case for p in plan if p.case.algorithm is Algorithm.NONE]
    assert len(twins) == 8 and {c.batch_size for c in twins} == {1, 8}
    spec = [p.case for p in plan if p.case.algorithm is Algorithm.EAGLE]
    assert {(c.attention_backend.value, c.page_size, c.topk) for c in spec} == {
        (b, p, k) for b in ("triton", "flashinfer") for p in (1, 64) for k in (1, 4)
    }


def test_shipped_suites_plan_the_case_ids_they_planned_before_the_serving_fields():
    pinned = json.loads((Path(__file__).parent / "fixtures" / "shipped_case_ids.json").read_text())
    assert len(pinned) >= 13
    for name, ids in pinned.items():
        # the ids were pinned before smoke and tree-page planned plain twins: their matrix cases
        assert [p.case.case_id for p in load_suite(SUITES / name).plan() if not p.twin] == ids, name


def test_serving_prompts_enter_the_id_only_when_given():
    default = serving_case()
    assert "serving_prompts" not in default.params() and default.serving_requests == SERVING_PROMPTS_DEFAULT
    named = serving_case(serving_prompts=64)
    assert named.params()["serving_prompts"] == 64 and named.case_id != default.case_id
    with pytest.raises(ValueError, match="serving workload"):
        serving_case(workload=Workload.standard, serving_prompts=64)


def test_concurrency_above_the_prompt_count_is_skipped_and_prompts_outside_serving_refused(tmp_path):
    assert skip_reason(serving_case(batch_size=128)).startswith("serving-concurrency:")
    assert skip_reason(serving_case(batch_size=64)) is None
    text = (SUITES / "serving.toml").read_text().replace('workload = ["serving"]', 'workload = ["standard"]')
    bad = tmp_path / "bad.toml"
    bad.write_text(text + "serving_prompts = [32]\n")
    with pytest.raises(SpecwatchInputError, match="serving workload only"):
        load_suite(bad)


def test_own_models_may_run_the_serving_workload():
    from specwatch.own.suite_model import own_skip_reason
    from specwatch.rules.validity import RULES

    own = dict(name="m", config_sha="0" * 16, target="/x", draft="/y", context_len=4096)
    c = serving_case(model=ModelSize.own, own_model=own, prompts={"source": "random", "count": 8})
    assert own_skip_reason(c, RULES) is None
    assert own_skip_reason(c.model_copy(update={"workload": Workload.near_full}), RULES).startswith(
        "own-model-workload"
    )


class Emit:
    def __init__(self):
        self.lines = []

    def __call__(self, line):
        self.lines.append(line)

    def case(self, line):
        self.lines.append(line)


class Guard:
    def elapsed(self):
        return 0.0

    def paused(self):
        import contextlib

        return contextlib.nullcontext()


def _group(tmp_path, cases, monkeypatch, script: str):
    """A serving group whose "server" is ``script`` run by Python."""
    spec = WorkerSpec(cases=cases, repeats=1, warmup=True, models_dir=str(tmp_path), results=str(tmp_path / "r.jsonl"))
    bench = serving_benchmark_for("0.5.23")
    group = serving.Group(spec, {"model_path": "/x"}, [], tmp_path, tmp_path, bench, tmp_path, 0.0)
    monkeypatch.setattr(serving, "_setup", lambda s: group)
    monkeypatch.setattr(serving_server, "server_argv", lambda *a, **k: [sys.executable, "-c", script])
    monkeypatch.setattr(serving_server, "POLL_S", 0.05)
    return spec


def test_a_server_that_exits_fails_every_case_of_its_group_with_its_log(tmp_path, monkeypatch):
    cases = [serving_case(batch_size=1), serving_case(batch_size=8)]
    spec = _group(tmp_path, cases, monkeypatch, "print('CUDA out of memory (fake)'); raise SystemExit(3)")
    emit = Emit()
    serving.run_serving(spec, emit, Guard(), lock=None)
    assert [ln["case_id"] for ln in emit.lines] == [c.case_id for c in cases]
    for ln in emit.lines:
        CaseLine.model_validate(ln)
        assert ln["status"] == "failed" and "exited with code 3" in ln["reason"]
        assert "CUDA out of memory (fake)" in ln["log_tail"]
    assert (tmp_path / f"{cases[0].case_id}-server.log").exists()


def test_a_server_refused_by_sglangs_argument_checks_is_skipped(tmp_path, monkeypatch):
    tb = (
        "Traceback (most recent call last):\\n"
        '  File \\"/usr/lib/python3/site-packages/sglang/srt/server_args.py\\", line 9, in check_server_args\\n'
        "ValueError: topk > 1 needs flashinfer"
    )
    spec = _group(tmp_path, [serving_case()], monkeypatch, f"import sys; print('{tb}'); sys.exit(1)")
    emit = Emit()
    serving.run_serving(spec, emit, Guard(), lock=None)
    assert emit.lines[0]["status"] == "skipped" and "topk > 1 needs flashinfer" in emit.lines[0]["log_tail"]


def test_a_server_that_never_turns_healthy_is_stopped_past_its_wait(tmp_path):
    log = tmp_path / "s.log"
    proc = serving_server.spawn([sys.executable, "-c", "import time; time.sleep(60)"], log)
    server = serving_server.Server(proc, "127.0.0.1", 1, log, [])
    with pytest.raises(serving_server.ServerDown, match="not healthy after"):
        server.wait_healthy(0.5)
    assert server.stop() is not None and proc.poll() is not None


def _serving_sources() -> list[Path]:
    return sorted(p for p in SOURCES.glob("0.5.*") if (p / "sglang/srt/entrypoints/http_server.py").is_file())


@pytest.mark.parametrize("src", _serving_sources(), ids=lambda p: p.name)
def test_the_kit_carries_what_the_http_server_needs_at_import(src):
    """FastAPI refuses a Form/File route at import without python-multipart, and from 0.5.19 the
    server imports audio_chunking (soundfile) at start: a kit without them cannot serve."""
    from specwatch.kit.releases import SERVING_PATH

    text = (src / "sglang/srt/entrypoints/http_server.py").read_text()
    if re.search(r"\b(Form|File|UploadFile)\(", text) or "UploadFile" in text:
        assert "python-multipart" in SERVING_PATH, src.name
    chunking = src / "sglang/srt/entrypoints/openai/audio_chunking.py"
    if chunking.is_file() and re.search(r"^import soundfile|^\s*import soundfile", chunking.read_text(), re.M):
        assert "soundfile" in SERVING_PATH, src.name


def _dataset_sources() -> list[Path]:
    return sorted(p for p in SOURCES.glob("0.5.*") if (p / "sglang/benchmark/datasets/random.py").is_file())


@pytest.fixture
def sglang_dataset_module(monkeypatch):
    """``sample_random_requests`` of a fetched release, imported without SGLang's package
    ``__init__`` files (they import the GPU stack and Hugging Face datasets)."""
    import importlib
    import types

    before = {k: v for k, v in sys.modules.items() if k == "sglang" or k.startswith("sglang.")}

    def load(src: Path):
        for k in [k for k in sys.modules if k == "sglang" or k.startswith("sglang.")]:
            monkeypatch.delitem(sys.modules, k)
        for name in ("sglang", "sglang.benchmark", "sglang.benchmark.datasets"):
            pkg = types.ModuleType(name)
            pkg.__path__ = [str(src.joinpath(*name.split(".")))]
            monkeypatch.setitem(sys.modules, name, pkg)
        return importlib.import_module("sglang.benchmark.datasets.random")

    yield load
    for k in [k for k in sys.modules if k == "sglang" or k.startswith("sglang.")]:
        del sys.modules[k]
    sys.modules.update(before)


@pytest.mark.parametrize("src", _dataset_sources()[:1] + _dataset_sources()[-1:], ids=lambda p: p.name)
def test_sglangs_random_dataset_sends_the_oracle_chains_of_the_prompts_file(src, tmp_path, sglang_dataset_module):
    """The benchmark's own sampler on the file ``serving_prompts`` writes: every request an oracle
    chain of exactly input_len active tokens, each once; its random ids would end about half the
    prompts on an inactive token, whose greedy output streams as empty text."""
    from transformers import AutoTokenizer

    from specwatch.oracle.shapes import FIRST_ACTIVE
    from specwatch.oracle.tokenizer import write_tokenizer
    from specwatch.worker import serving_prompts

    random_mod = sglang_dataset_module(src)
    c = serving_case(attention_backend=Backend.triton, serving_prompts=32)
    shape = SHAPES[c.model]
    write_tokenizer(tmp_path / "tok", shape)
    tok = AutoTokenizer.from_pretrained(tmp_path / "tok")
    path = serving_prompts.write_dataset(c, tmp_path)
    rows = random_mod.sample_random_requests(
        input_len=c.input_len,
        output_len=c.output_len,
        num_prompts=c.serving_requests,
        range_ratio=1.0,
        tokenizer=tok,
        dataset_path=str(path),
        random_sample=True,
        return_text=False,
    )
    prompts, _ = serving_prompts.oracle_requests(c)
    assert sorted(r.prompt for r in rows) == sorted(prompts)
    assert all(r.prompt_len == c.input_len and r.output_len == c.output_len for r in rows)
    active = range(FIRST_ACTIVE, FIRST_ACTIVE + shape.active)
    assert all(t in active for r in rows for t in r.prompt)
    ids = random_mod.sample_random_requests(
        input_len=c.input_len,
        output_len=c.output_len,
        num_prompts=64,
        range_ratio=1.0,
        tokenizer=tok,
        dataset_path="",
        random_sample=False,
        return_text=False,
    )
    assert sum(r.prompt[-1] < FIRST_ACTIVE for r in ids) > 8  # what random-ids sends the oracle


def test_generated_texts_are_compared_with_the_oracle_token_by_token():
    from specwatch.oracle.tokenizer import vocabulary
    from specwatch.worker import serving_prompts

    c = serving_case(serving_prompts=4, output_len=16)
    words = {i: w for w, i in vocabulary(SHAPES[c.model]).items()}
    outs = [[words[t] for t in out] for out in serving_prompts.oracle_requests(c)[1]]
    texts = [" " + " ".join(o) for o in reversed(outs)]  # any order, leading space as streamed
    assert serving_prompts.mismatched_tokens(c, texts) == 0
    wrong = list(outs[0])
    wrong[5] = wrong[6]
    assert serving_prompts.mismatched_tokens(c, [" ".join(wrong)] + texts[:-1]) == 1
    assert serving_prompts.mismatched_tokens(c, [""] + texts[:-1]) == 16  # nothing streamed
    assert serving_prompts.mismatched_tokens(c, [texts[0], texts[0]] + texts[2:]) == 16  # one output twice


def test_a_request_without_a_first_token_time_fails_its_check():
    line = read_output(FIXTURES / "bench-0.5.23.jsonl")
    timed = {**line, "ttfts": [0.02] * 64, "errors": [""] * 64}
    res = parse_output([timed], serving_case(serving_prompts=64))
    assert res["checks"]["first_token_timed_every_request"] is True
    untimed = {**timed, "ttfts": [0.02] * 30 + [0.0] * 34}
    res = parse_output([timed, untimed], serving_case(serving_prompts=64))
    assert res["checks"]["first_token_timed_every_request"] is False
    assert res["details"]["requests_without_first_token_time"] == [0, 34]
    failed = {**timed, "ttfts": [0.0] + [0.02] * 63, "errors": ["boom"] + [""] * 63}
    assert parse_output([failed], serving_case())["checks"]["first_token_timed_every_request"] is True
    assert "first_token_timed_every_request" not in parse_output([line], serving_case())["checks"]
