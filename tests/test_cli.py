import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import specwatch
from conftest import SUITES
from specwatch.cli import app

runner = CliRunner()
SRC = Path(specwatch.__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _piped_width(monkeypatch):
    """Output as piped to a file (pytest-xdist workers set COLUMNS=80)."""
    monkeypatch.delenv("COLUMNS", raising=False)


def specwatch_cli(*args, prelude: str = "", **env) -> subprocess.CompletedProcess:
    """The console script's function, ``specwatch.cli:main``, in a fresh interpreter."""
    environ = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    environ.update(env, PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run(
        [sys.executable, "-c", f"{prelude}from specwatch.cli import main; main()", *map(str, args)],
        capture_output=True,
        text=True,
        env=environ,
    )


def test_plan_lists_every_case_with_skips():
    res = runner.invoke(app, ["plan", str(SUITES / "dcp.toml"), "--json"])
    assert res.exit_code == 0
    rows = [json.loads(l) for l in res.stdout.splitlines()]
    # 8 NGRAM + 12 FlashMLA + 8 flashinfer-MLA topk>1 skips
    assert len(rows) == 256 and sum(r["skip"] is not None for r in rows) == 28
    # the table names each case's model (dcp.toml has three oracles)
    table = runner.invoke(app, ["plan", str(SUITES / "dcp.toml"), "--where", "model=tiny-mla"], terminal_width=300)
    assert table.exit_code == 0 and "model" in table.stdout and "tiny-mla" in table.stdout


def test_bad_backend_is_one_line_no_traceback(tmp_path):
    p = tmp_path / "bad.toml"
    p.write_text('[suite]\nname="b"\n[[matrix]]\nattention_backend=["cutlass"]\npage_size=[1]\ntopk=[1]\n')
    res = subprocess.run([sys.executable, "-m", "specwatch.cli", "plan", str(p)], capture_output=True, text=True)
    assert res.returncode == 2
    assert "Traceback" not in res.stderr
    assert f"{p}: matrix[0].attention_backend[0]:" in res.stderr.replace("\n", "")


@pytest.mark.sglang
def test_model_memory_prints_both_agreeing():
    res = runner.invoke(app, ["model", "memory", "--page", "64", "--topk", "8", "--steps", "3", "--draft", "16"])
    assert res.exit_code == 0, res.stdout
    assert "alloc_len_per_decode" in res.stdout and "NO" not in res.stdout
    assert res.stdout.count("yes") == 6


@pytest.mark.sglang
def test_model_simulate_exit_codes():
    ok = runner.invoke(app, ["model", "simulate", "--page", "64", "--topk", "8", "--json"])
    assert ok.exit_code == 0 and json.loads(ok.stdout)["clean"] is True
    bad = runner.invoke(
        app, ["model", "simulate", "--page", "64", "--topk", "8", "--fault", "row-widen-revert", "--json"]
    )
    assert bad.exit_code == 1 and json.loads(bad.stdout)["leaked_pages"] > 0
    args = ["model", "simulate", "--page", "64", "--topk", "1", "--draft", "4", "--dcp", "2", "--near-full", "--json"]
    unsharded = runner.invoke(app, args + ["--kv-write-ignores-dcp"])
    out = json.loads(unsharded.stdout)
    assert unsharded.exit_code == 1 and out["missing_target_rows"] > 0 and out["first_missing_target_usage"] >= 0.5
    assert json.loads(runner.invoke(app, args).stdout)["missing_target_rows"] == 0


@pytest.mark.sglang
def test_run_without_gpu_is_the_cpu_tier(tmp_path):
    res = runner.invoke(app, ["run", str(SUITES / "smoke.toml"), "--cpu-tier", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.stdout
    mem = json.loads((tmp_path / "smoke" / "memory.json").read_text())
    # 8 speculative cases and 4 plain-decoding twins (one per backend x page), sized alike
    assert len(mem) == 12 and all(r["sglang_agrees"] for r in mem)
    assert sum(r["label"].startswith("tiny/NONE/") for r in mem) == 4
    sim = json.loads((tmp_path / "smoke" / "simulation.json").read_text())
    # smoke's page-1 tree (topk 4, draft 8) is covered by EAGLE's admission reserve
    assert {(r["page_size"], r["topk"]): r["clean"] for r in sim} == {
        (1, 1): True,
        (1, 4): True,
        (64, 1): True,
        (64, 4): True,
    }
    assert "not clean" not in res.stdout


def _one_matrix_suite(tmp_path, name: str, matrix: str):
    p = tmp_path / f"{name}.toml"
    p.write_text(f'[suite]\nname="{name}"\n[[matrix]]\n{matrix}\n')
    return p


@pytest.mark.sglang
def test_cpu_tier_strict_fails_on_an_unclean_simulation(tmp_path):
    p = _one_matrix_suite(
        tmp_path, "k8", 'attention_backend=["triton"]\npage_size=[1]\ntopk=[8]\nnum_draft_tokens=[16]'
    )
    res = runner.invoke(app, ["run", str(p), "--cpu-tier", "--out", str(tmp_path)])
    assert res.exit_code == 0 and "1 of 1 allocator simulations not clean" in res.stdout
    strict = runner.invoke(app, ["run", str(p), "--cpu-tier", "--strict", "--out", str(tmp_path)])
    assert strict.exit_code == 1


@pytest.mark.sglang
def test_cpu_tier_says_where_a_dcp_unaware_kv_write_would_leave_the_pool(tmp_path):
    p = _one_matrix_suite(
        tmp_path,
        "d",
        'attention_backend=["flashinfer"]\npage_size=[64]\ntopk=[1]\nnum_draft_tokens=[4]\ntp=[2]\ndcp=[1, 2]',
    )
    res = runner.invoke(app, ["run", str(p), "--cpu-tier", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.stdout
    sim = {r["dcp"]: r for r in json.loads((tmp_path / "d" / "simulation.json").read_text())}
    assert 0.5 <= sim[2]["unsharded_kv_write_first_missing_usage"] < 1  # past 1 / dcp of the pool
    first = sim[1].get("unsharded_kv_write_first_missing_usage")
    assert first is None or first != first  # dcp 1: not simulated (NaN)


def test_where_is_validated_and_applied(tmp_path):
    bad = runner.invoke(app, ["run", str(SUITES / "smoke.toml"), "--cpu-tier", "--where", "bogus=1"])
    assert bad.exit_code == 2
    ok = runner.invoke(
        app, ["run", str(SUITES / "smoke.toml"), "--cpu-tier", "--where", "page_size=64", "--out", str(tmp_path)]
    )
    assert ok.exit_code == 0
    # page 64's 4 cases and their 2 plain twins (triton, flashinfer)
    assert len(json.loads((tmp_path / "smoke" / "memory.json").read_text())) == 6


def test_results_health_names_failed_checks(tmp_path):
    from records import case, record
    from specwatch.store.jsonl import append_record, results_path

    good, bad = record(case(page_size=1)), record(case(page_size=64))
    good.checks["lossless"], good.checks["no_kv_leak"] = True, True  # all-bool column: numpy bools
    bad.checks["lossless"], bad.checks["no_kv_leak"] = True, False
    for r in (good, bad):
        append_record(results_path(tmp_path, "m", "0.5.17", "smoke"), r)
    res = runner.invoke(app, ["results", str(tmp_path)])
    assert res.exit_code == 0
    assert f"{bad.case_id} smoke tiny triton p64 k4 bs1: failed no_kv_leak" in res.stdout
    assert good.case_id not in res.stdout
    assert "engine start breakdown" not in res.stdout  # no record has one yet


def test_results_breaks_engine_starts_down(tmp_path):
    from records import case, record
    from specwatch.core.record import Metric
    from specwatch.store.frame import records_frame
    from specwatch.store.jsonl import append_record, results_path

    recs = [record(case(page_size=p)) for p in (1, 16, 64)]
    for r, start in zip(recs, (40.0, 50.0, 90.0)):
        r.metrics["engine_start_time"] = Metric(value=start, unit="s")
        r.metrics["decode_throughput"] = Metric(value=100.0, unit="tokens/s", samples=[90.0, 100.0, start + 70])
        r.details["probe"] = {
            "startup": {
                "load_weight": 1.0,
                "scheduler_e2e": start - 20,
                "cuda_graph": {"decode": 3.0, "verify": 2.0},
                "process_to_scheduler_init": 12.0,
            }
        }
        append_record(results_path(tmp_path, "m", "0.5.17", "smoke"), r)
    row = records_frame(recs).iloc[0]
    assert (row["start.cuda_graph"], row["start.scheduler_e2e"], row["start.process_to_scheduler_init"]) == (
        5.0,
        20.0,
        12.0,
    )
    res = runner.invoke(app, ["results", str(tmp_path)], terminal_width=200)
    assert res.exit_code == 0 and "engine start breakdown" in res.stdout
    line = next(x for x in res.stdout.splitlines() if "triton" in x and "0.5.17" in x and "50" in x)
    assert "30" in line and "12" in line  # medians: start 50, scheduler 30, imports 12
    assert "spread within a case's repeats" in res.stdout  # spreads 0.2, 0.3, 0.7: median 0.3
    assert any("tiny" in x and "0.3 " in x + " " and "│ 3 " in x for x in res.stdout.splitlines())


def test_run_on_gpu_path_shows_progress_and_records(tmp_path, monkeypatch):
    """The GPU branch of `specwatch run` (CUDA faked, fake worker): progress lines and a results file."""
    import dataclasses
    import os

    import specwatch.commands.run as run_cmd
    import specwatch.run.runner as runner_mod

    here = os.path.dirname(__file__)
    monkeypatch.setattr(run_cmd, "_cuda_available", lambda: True)
    real = runner_mod.run_suites
    monkeypatch.setattr(
        runner_mod,
        "run_suites",
        lambda suites, root, options: real(
            suites,
            root,
            dataclasses.replace(
                options,
                gpus=1,
                worker_module="fake_worker",
                extra_env={"PYTHONPATH": here + os.pathsep + os.environ.get("PYTHONPATH", "")},
            ),
        ),
    )
    p = tmp_path / "s.toml"
    p.write_text('[suite]\nname="g"\nrepeats=1\n[[matrix]]\nattention_backend=["triton"]\npage_size=[1,64]\ntopk=[1]\n')
    res = runner.invoke(app, ["run", str(p), "--results", str(tmp_path / "res")])
    assert res.exit_code == 0, res.stdout
    assert res.stdout.count("ok       ") == 2 and "results in" in res.stdout
    assert list((tmp_path / "res").rglob("g.jsonl"))


def _runs_at(tmp_path, levels):
    """One results file per run, each holding one case at the given tokens/s (repeats level +- 1)."""
    from records import case, record
    from specwatch.core.record import Metric
    from specwatch.store.jsonl import append_record

    files = []
    for i, level in enumerate(levels):
        r = record(case(page_size=64))
        r.metrics["output_throughput"] = Metric(
            value=level, unit="tokens/s", samples=[level - 1, level, level + 1], higher_is_better=True
        )
        files.append(tmp_path / f"run{i}.jsonl")
        append_record(files[-1], r)
    return files


def test_noise_writes_budgets_and_checks_a_held_out_pair(tmp_path):
    """Three runs of one version: budgets from runs 1-2 applied to runs 2-3 (held out)."""
    files = _runs_at(tmp_path, (100, 70, 85))
    budgets = tmp_path / "budgets.json"
    res = runner.invoke(app, ["noise", str(files[0]), str(files[1]), "-o", str(budgets)])
    assert res.exit_code == 0, res.stdout
    assert "1 of 1 timed metrics flagged" in res.stdout and "100.0%" in res.stdout
    data = json.loads(budgets.read_text())
    assert data["pairs"][0]["false_positive_rate"] == 1.0 and abs(list(data["budgets"].values())[0] - 0.45) < 1e-9
    res = runner.invoke(app, ["noise", str(files[1]), str(files[2]), "--budgets", str(budgets)])
    assert res.exit_code == 0 and "under the budgets" in res.stdout and "0 of 1 flagged" in res.stdout
    # a second pair merged in: both pairs kept, each budget covers the larger of the two spreads
    (budgets_v1 := tmp_path / "v1.json").write_text(
        json.dumps({"base": "a", "head": "b", "false_positive_rate": 1.0, "budgets": {"other/output_throughput": 0.9}})
    )
    res = runner.invoke(app, ["noise", str(files[1]), str(files[2]), "-o", str(budgets_v1), "--merge"])
    assert res.exit_code == 0, res.stdout
    merged = json.loads(budgets_v1.read_text())
    assert [p["base"] for p in merged["pairs"]] == ["a", str(files[1])]
    klass = next(k for k in data["budgets"])
    assert merged["budgets"]["other/output_throughput"] == 0.9
    assert abs(merged["budgets"][klass] - round(1.5 * (85 - 70) / 70, 4)) < 1e-9  # 0.3214: this pair's own
    res = runner.invoke(app, ["noise", str(files[0]), str(files[1]), "-o", str(budgets_v1), "--merge"])
    assert abs(json.loads(budgets_v1.read_text())["budgets"][klass] - 0.45) < 1e-9  # the larger spread wins
    bad = tmp_path / "bad.json"
    bad.write_text("[]")
    res = specwatch_cli("compare", files[0], files[1], "--budgets", bad)
    assert res.returncode == 2 and "bad.json" in res.stderr and "budgets" in res.stderr


def test_noise_holdout_judges_each_pair_under_the_other_pairs_budgets(tmp_path):
    """Pair A moves 30% (budget 45%), pair B 1% (budget: the 5% floor). Left out in turn: A under
    B's budget is flagged, B under A's is not; the markdown copy has one row per pair."""
    files = _runs_at(tmp_path, (100, 70, 85, 84))
    budgets = tmp_path / "budgets.json"
    assert runner.invoke(app, ["noise", str(files[0]), str(files[1]), "-o", str(budgets)]).exit_code == 0
    res = specwatch_cli("noise-holdout", budgets)
    assert res.returncode == 2 and "two or more" in res.stderr
    assert runner.invoke(app, ["noise", str(files[2]), str(files[3]), "-o", str(budgets), "--merge"]).exit_code == 0
    md = tmp_path / "holdout.md"
    res = runner.invoke(app, ["noise-holdout", str(budgets), "-o", str(md)])
    assert res.exit_code == 0, res.output
    assert "held out, clean pairs: 1 of 2 timed metrics flagged (50.0%" in res.output
    rows = [line for line in md.read_text().splitlines() if line.startswith("| ") and ".jsonl" in line]
    assert len(rows) == 2 and all(line.count(" | ") == 6 for line in rows)
    assert f"The rule checked is `compare --budgets {budgets}`" in md.read_text()  # not the scaled floor's
    # what the low rate costs: the merged budget (A's 45%) is the smallest change called a regression
    price = md.read_text().split("## Smallest change called a regression")[1]
    assert [line for line in price.splitlines() if line.startswith("| ") and "45%" in line]


def test_import_takes_a_fetched_folder_with_records_and_run_summaries(tmp_path):
    from datetime import datetime, timezone

    from records import case, record
    from specwatch.core.record import RunSummary
    from specwatch.store.jsonl import append_record, append_run

    fetched = tmp_path / "fetched"
    append_record(fetched / "m" / "sglang-0.5.17" / "smoke.jsonl", record(case(page_size=64)))
    now = datetime(2026, 11, 30, tzinfo=timezone.utc)
    append_run(
        fetched,
        RunSummary(
            suites=["smoke"],
            faults=[None],
            parallel_starts=8,
            engine_groups=8,
            worker_starts=8,
            records={"ok": 8},
            wall_s=200.0,
            case_s=50.0,
            engine_start_s=400.0,
            stopped_early=False,
            machine="m",
            sglang_version="0.5.17",
            started_at=now,
            finished_at=now,
        ),
    )
    res = runner.invoke(app, ["import", str(fetched), "--results", str(tmp_path / "results")])
    assert res.exit_code == 0 and "+1 records" in res.stdout and "+1 run summaries" in res.stdout
    res = runner.invoke(app, ["import", str(fetched), "--results", str(tmp_path / "results")])
    assert "nothing new" in res.stdout
    res = runner.invoke(app, ["results", str(tmp_path / "results")])
    assert "sweep cost" in res.stdout and "4.0" in res.stdout
    # the dashboard shows the same table
    res = runner.invoke(app, ["dashboard", "--results", str(tmp_path / "results"), "--out", str(tmp_path / "dash")])
    page = (tmp_path / "dash" / "index.html").read_text()
    assert res.exit_code == 0 and "Sweep cost per GPU run" in page and 'data-v="4.0">4</td>' in page


def test_overhead_exits_1_when_the_probe_costs_more_than_2_percent(tmp_path):
    from records import case, record
    from specwatch.store.jsonl import append_record, results_path

    def store(recs):
        for r in recs:
            append_record(results_path(tmp_path, "m", "0.5.17", r.suite, None, r.provenance.probe), r)

    c = case(page_size=64)
    store([record(c, tps=995.0), record(c, tps=1000.0, probe=False)])
    res = runner.invoke(app, ["overhead", "--results", str(tmp_path)])
    assert res.exit_code == 0 and "within 2%" in res.output
    store([record(case(page_size=1), tps=900.0), record(case(page_size=1), tps=1000.0, probe=False)])
    res = runner.invoke(app, ["overhead", "--results", str(tmp_path)])
    assert res.exit_code == 1 and "slower by more than 2%" in res.output
    assert "geometric mean 0.9463, probed faster in 0 of 2" in res.output  # sqrt(0.995 x 0.9)


def test_plan_leaves_out_known_cases_and_estimates_device_time(tmp_path):
    from datetime import datetime, timedelta, timezone

    from records import record
    from specwatch.core.record import RunSummary
    from specwatch.store.jsonl import append_record, append_run
    from specwatch.suite import load_suite

    smoke = load_suite(SUITES / "smoke.toml").plan()
    done = [p.case for p in smoke if p.case.attention_backend.value == "triton"]
    for c in done:
        r = record(c, machine="m")
        append_record(tmp_path / "m" / "sglang-0.5.17" / "smoke.jsonl", r)
    now = datetime(2026, 11, 30, tzinfo=timezone.utc)
    for wall in (
        200.0,
        300.0,
        9000.0,
    ):  # 20 and 30 s per group (4 groups: 100 s); the last was cut by SIGTERM: left out
        append_run(
            tmp_path,
            RunSummary(
                suites=["smoke"],
                faults=[None],
                parallel_starts=8,
                engine_groups=10,
                worker_starts=10,
                records={"ok": 10},
                wall_s=wall,
                case_s=50.0,
                engine_start_s=400.0,
                stopped_early=wall > 1000,
                stopped_by="SIGTERM" if wall > 1000 else None,
                machine="m",
                sglang_version="0.5.17",
                started_at=now,
                finished_at=now,
            ),
        )
    res = runner.invoke(
        app,
        [
            "plan",
            str(SUITES / "smoke.toml"),
            "--known",
            str(tmp_path),
            "--machine",
            "m",
            "--sglang-version",
            "0.5.17",
            "--json",
        ],
    )
    assert res.exit_code == 0, res.stdout
    lines = res.stdout.splitlines()
    assert lines[0] == f"smoke: {len(done)} case(s) already recorded for m / SGLang 0.5.17; 6 left in 6 engine group(s)"
    assert "≈ 2 device minutes" in lines[1] and "median 25 s" in lines[1] and "over 2 run(s)" in lines[1]
    left = [json.loads(x) for x in lines[2:]]
    # flashinfer's 4 cases and its 2 plain twins (page 1 and 64)
    assert len(left) == 6 and {x["attention_backend"] for x in left} == {"flashinfer"}
    res = specwatch_cli("plan", SUITES / "smoke.toml", "--known", tmp_path)
    assert res.returncode == 2 and "--machine and --sglang-version" in res.stderr
    # records that carry their own clock: the suite's own pace, 90 s per recorded group
    for c in done:
        r = record(c, machine="m", started_at=now, finished_at=now + timedelta(seconds=90))
        append_record(tmp_path / "m" / "sglang-0.5.17" / "smoke.jsonl", r)
    args = ["plan", str(SUITES / "smoke.toml"), "--known", str(tmp_path), "--machine", "m"]
    res = runner.invoke(app, [*args, "--sglang-version", "0.5.17"])
    assert res.exit_code == 0, res.stdout
    assert "≈ 9 device minutes at smoke's own recorded pace" in res.stdout  # 6 groups x 90 s
    # several passes: each is left what its own file lacks (the null fault's file is empty), priced apart
    res = runner.invoke(app, [*args, "--sglang-version", "0.5.17", "--fault", "none", "--fault", "slow-verify-0us"])
    assert res.exit_code == 0, res.stdout
    said = [x for x in res.stdout.splitlines() if x.startswith(("smoke, pass", "≈"))]
    assert said[0].startswith(f"smoke, pass none: {len(done)} case(s) already recorded") and "6 left" in said[0]
    assert said[2].startswith("smoke, pass slow-verify-0us: 0 case(s) already recorded")
    assert said[1].startswith("≈ 9 device minutes") and said[-1] == "≈ 27 device minutes for the 2 passes together"


SMOKE = SUITES / "smoke.toml"


@pytest.mark.parametrize(
    "args, names",
    [
        (["model", "memory", "--page", "0"], "--page"),
        (["model", "memory", "--page", "-4"], "--page"),
        (["model", "simulate", "--page", "0"], "--page"),
        (["model", "simulate", "--requests", "0"], "--requests"),
        (["import", "{tmp}/missing.jsonl"], "missing.jsonl"),
        (["plan", SMOKE, "--where", "page_size=abc"], "page_size"),
        (["run", SMOKE, "--cpu-tier", "--where", "page_size=abc"], "page_size"),
        (["plan", SMOKE, "--where", "page_size=3"], "page_size=3"),
        (["run", SMOKE, "--cpu-tier", "--shard", "3/2"], "--shard"),
        (["results", "{tmp}/no-such-dir"], "no-such-dir"),
        (["plan", SMOKE, "--bogus"], "--bogus"),
        (["plan", SMOKE, "--fault", "slow-verify-0us"], "--known"),
        (
            ["plan", SMOKE, "--fault", "nope", "--known", "{tmp}", "--machine", "m", "--sglang-version", "0.5.17"],
            "nope",
        ),
        (["noise-holdout", "{tmp}/nope.json"], "nope.json"),
        (["model", "memory", "--json", "{tmp}/no/such/dir/m.json"], "m.json"),  # a write that fails
    ],
)
def test_bad_input_is_one_line_naming_it_exit_2(tmp_path, args, names):
    res = specwatch_cli(*(str(a).replace("{tmp}", str(tmp_path)) for a in args))
    assert res.returncode == 2, res.stdout + res.stderr
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert res.stderr.startswith("error: ") and names in res.stderr


def test_inject_without_sglang_is_one_line_exit_2():
    res = specwatch_cli("inject", "row-widen-revert", prelude="import sys; sys.modules['sglang'] = None; ")
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.strip().splitlines() == [res.stderr.strip()] and "sglang is not importable" in res.stderr


def test_version_names_specwatch_and_sglang_without_importing_torch():
    from specwatch.core.sglang_host import sglang_version

    res = specwatch_cli(
        "--version", prelude="import atexit, sys; atexit.register(lambda: print('torch' in sys.modules)); "
    )
    assert res.returncode == 0, res.stderr
    sglang = sglang_version()
    assert res.stdout.splitlines() == [
        f"specwatch {specwatch.__version__}, " + (f"SGLang {sglang}" if sglang else "SGLang not installed"),
        "False",
    ]


def test_console_script_is_the_one_error_handler():
    import tomllib

    scripts = tomllib.loads((SRC.parent / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["specwatch"] == "specwatch.cli:main"


def test_run_progress_lines_name_the_fault_pass(monkeypatch, capsys, tmp_path):
    # a fault name in brackets is printed as text: rich read "[slow-verify-0us]" as a style tag
    # and dropped it, so the passes of an interleaved run printed identical lines
    from records import record
    from specwatch.commands.run import run_with_progress
    from specwatch.run import runner
    from specwatch.run.options import RunOptions

    rec = record(fault="slow-verify-0us")

    def fake_run_suites(loaded, results, options):
        options.start_progress(rec, 1, 3)
        options.progress(rec)
        return []

    monkeypatch.setattr(runner, "run_suites", fake_run_suites)
    run_with_progress([], tmp_path, RunOptions())
    out = capsys.readouterr().out
    assert f"start 1/3 {rec.case_id}" in out and out.count("[slow-verify-0us]") == 2
