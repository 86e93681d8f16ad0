"""The device helpers in scripts/ (bash), driven here with a fake run script instead of specwatch."""

import os
import shutil
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FAKE_RUN = """#!/usr/bin/env bash
mkdir -p "$SPECWATCH_DEVICE_RESULTS"; printf '%s|' "$@" >> "$SPECWATCH_DEVICE_RESULTS/runs.txt"; echo >> "$SPECWATCH_DEVICE_RESULTS/runs.txt"
"""


@pytest.mark.skipif(shutil.which("setsid") is None, reason="device-bg.sh needs setsid (util-linux)")
def test_device_bg_chains_segments_in_order_and_packs_each_named_run(tmp_path):
    (tmp_path / "fake.sh").write_text(FAKE_RUN)
    out = tmp_path / "out"
    out.mkdir()
    names = [f"sw-test-{os.getpid()}-{i}" for i in range(2)]
    env = dict(os.environ, OUT=str(out), BG_SCRIPT=str(tmp_path / "fake.sh"))
    script = str(ROOT / "scripts" / "device-bg.sh")
    try:
        subprocess.run(
            [
                "bash",
                script,
                "start",
                "c0ffee",
                "suites/a.toml",
                "--where",
                "model=tiny attn",
                "--then",
                "suites/b.toml",
                "--known",
                "results",
            ],
            env=dict(env, BG_NAME=names[0]),
            cwd=tmp_path,
            check=True,
            capture_output=True,
        )
        subprocess.run(
            ["bash", script, "start", "c0ffee", "suites/c.toml"],
            env=dict(env, BG_NAME=names[1]),
            cwd=tmp_path,
            check=True,
            capture_output=True,
        )
        waited = subprocess.run(
            ["bash", script, "wait", "60", *names], env=env, cwd=tmp_path, capture_output=True, text=True
        )
        assert waited.returncode == 0, waited.stdout + waited.stderr
        with tarfile.open(out / f"{names[0]}.tgz") as t:
            runs = t.extractfile("./runs.txt").read().decode().splitlines()
        # one run per segment, in order, the commit first and a quoted argument kept whole
        assert runs == ["c0ffee|suites/a.toml|--where|model=tiny attn|", "c0ffee|suites/b.toml|--known|results|"]
        assert (out / f"{names[1]}.tgz").exists() and f"{names[1]} ended, rc 0" in waited.stdout
    finally:
        for n in names:
            subprocess.run(f"rm -rf /tmp/{n} /tmp/{n}-repo /tmp/{n}-out /tmp/{n}.*", shell=True)


@pytest.mark.skipif(shutil.which("setsid") is None, reason="device-bg.sh needs setsid (util-linux)")
def test_device_bg_stop_ends_the_whole_chain_also_under_job_control(tmp_path):
    (tmp_path / "slow.sh").write_text("#!/usr/bin/env bash\nsleep 60\n")
    name = f"sw-test-{os.getpid()}-stop"
    env = dict(os.environ, OUT=str(tmp_path), BG_SCRIPT=str(tmp_path / "slow.sh"), BG_NAME=name)
    script = str(ROOT / "scripts" / "device-bg.sh")
    try:
        # `set -m` as the device's shell has it: setsid forks, so $! is not the chain's pid
        subprocess.run(
            ["bash", "-c", f"set -m; bash {script} start c0ffee a.toml --then b.toml"],
            env=env,
            cwd=tmp_path,
            check=True,
            capture_output=True,
        )
        pid = int(Path(f"/tmp/{name}.pid").read_text())
        os.kill(pid, 0)  # the recorded pid is the running chain
        stopped = subprocess.run(
            ["bash", script, "stop"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=30
        )
        assert "stopped" in stopped.stdout
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
        # the chain did not go on to its second run
        assert subprocess.run(["pgrep", "-f", f"{tmp_path}/slow.sh"], capture_output=True).returncode == 1
    finally:
        subprocess.run(f"rm -rf /tmp/{name} /tmp/{name}-repo /tmp/{name}-out /tmp/{name}.*", shell=True)


@pytest.mark.skipif(shutil.which("setsid") is None, reason="device-bg.sh needs setsid (util-linux)")
def test_device_bg_stop_reaches_the_runner_under_device_runs_timeout(tmp_path):
    """device-run.sh bounds the runner with `timeout`, which by default moves the runner into a
    process group of its own: `stop` must still reach it, so the runner records its stop."""
    site, fake, marker = tmp_path / "site", tmp_path / "bin", tmp_path / "runner-stopped"
    site.mkdir(), fake.mkdir()
    (site / "env.sh").write_text("export PYTHONPATH=${PYTHONPATH:-}\n")
    (fake / "python3").write_text(
        "#!/usr/bin/env bash\n"
        '[ "$2" = specwatch.cli ] || exit 0\n'
        f"trap 'touch {marker}; exit 143' TERM\n"
        'echo "ok case 1"; sleep 60 & wait\n'
    )
    (fake / "python3").chmod(0o755)
    name = f"sw-test-{os.getpid()}-stoprunner"
    env = dict(os.environ, PATH=f"{fake}:{os.environ['PATH']}", SPECWATCH_SITE=str(site), OUT=str(tmp_path))
    env.update(BG_NAME=name, SUMMARY_LINES="0")
    script = str(ROOT / "scripts" / "device-bg.sh")
    try:
        subprocess.run(["bash", script, "start", "0" * 40, "suites/smoke.toml"], env=env, cwd=ROOT, check=True)
        for _ in range(100):
            if Path(f"/tmp/{name}.log").exists() and "ok case 1" in Path(f"/tmp/{name}.log").read_text():
                break
            time.sleep(0.1)
        subprocess.run(["bash", script, "stop"], env=env, cwd=ROOT, check=True, timeout=120)
        assert marker.exists(), "the runner never got the stop"
    finally:
        # pkill apart from the shell that removes: `bash -c "pkill -f PATTERN; rm ..."` carries the
        # pattern in its own command line, so pkill ends that shell and nothing is removed
        subprocess.run(["pkill", "-f", f"{fake}/python3"])
        subprocess.run(f"rm -rf /tmp/{name} /tmp/{name}-repo /tmp/{name}-out /tmp/{name}.*", shell=True)


def test_device_run_logs_each_line_as_it_comes_and_returns_the_runs_exit_code(tmp_path):
    """A detached run's log is read while it runs (`device-bg.sh wait`): device-run.sh's filter must
    not hold lines back until the run ends (grep | cut did: block-buffered into a file)."""
    import signal

    site, fake, results, out = (tmp_path / n for n in ("site", "bin", "results", "out"))
    for d in (site, fake, results, out):
        d.mkdir()
    (site / "env.sh").write_text("export PYTHONPATH=${PYTHONPATH:-}\n")  # as the kit's env.sh sets it
    (fake / "python3").write_text(
        "#!/usr/bin/env bash\n"
        '[ "$2" = specwatch.cli ] || exit 0\n'
        'echo "ok case 1"; sleep "${FAKE_SLEEP:-0}"; echo "ok case 2"; exit 3\n'
    )
    (fake / "python3").chmod(0o755)
    env = dict(
        os.environ,
        PATH=f"{fake}:{os.environ['PATH']}",
        SPECWATCH_SITE=str(site),
        OUT=str(out),
        SPECWATCH_DEVICE_RESULTS=str(results),
        SUMMARY_LINES="0",
    )
    cmd = ["bash", str(ROOT / "scripts" / "device-run.sh"), "0" * 40, "suites/smoke.toml"]
    log = tmp_path / "run.log"
    with open(log, "w") as f:
        p = subprocess.Popen(
            cmd, env=dict(env, FAKE_SLEEP="30"), cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        for _ in range(100):
            if "ok case 1" in log.read_text():
                break
            subprocess.run(["sleep", "0.1"])
        assert "ok case 1" in log.read_text() and p.poll() is None  # seen while the run goes on
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 3 and "ok case 1\nok case 2" in done.stdout
    assert (out / "results.tgz").exists()


def test_device_run_reads_the_floors_from_the_checkouts_committed_results(tmp_path):
    """The run writes into an empty folder, so its "noisy host:" line reads the A/A runs of the
    checkout's results/ (``--floors``), unless the command names other floors."""
    site, fake, results, out = (tmp_path / n for n in ("site", "bin", "results", "out"))
    for d in (site, fake, results, out):
        d.mkdir()
    (site / "env.sh").write_text("export PYTHONPATH=${PYTHONPATH:-}\n")
    (fake / "python3").write_text('#!/usr/bin/env bash\n[ "$2" = specwatch.cli ] || exit 0\necho "args: $*"\n')
    (fake / "python3").chmod(0o755)
    env = dict(os.environ, PATH=f"{fake}:{os.environ['PATH']}", SPECWATCH_SITE=str(site), OUT=str(out))
    env.update(SPECWATCH_DEVICE_RESULTS=str(results), SUMMARY_LINES="0")
    cmd = ["bash", str(ROOT / "scripts" / "device-run.sh"), "0" * 40, "suites/smoke.toml"]
    done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("args:")]
    assert line.endswith(f"--results {results} --floors {ROOT}/results"), line
    done = subprocess.run([*cmd, "--floors", str(tmp_path)], env=env, cwd=ROOT, capture_output=True, text=True)
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("args:")]
    assert line.count("--floors") == 1 and line.endswith(f"--floors {tmp_path} --results {results}"), line


def test_device_cmd_runs_one_line_with_the_kits_python_and_returns_its_exit_code(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "env.sh").write_text("export KIT_MARK=from-the-kit\n")
    results = tmp_path / "res"
    env = dict(os.environ, SPECWATCH_SITE=str(site), SPECWATCH_DEVICE_RESULTS=str(results))
    line = 'echo "$KIT_MARK $COMMIT" > $SPECWATCH_DEVICE_RESULTS/o.txt; exit 3'
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "device-cmd.sh"), "a" * 40, line],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 3 and "rc 3" in done.stdout
    assert (results / "o.txt").read_text().split() == ["from-the-kit", "a" * 40]
    short = subprocess.run(["bash", str(ROOT / "scripts" / "device-cmd.sh"), "abc", "true"], capture_output=True)
    assert short.returncode == 2


@pytest.mark.skipif(shutil.which("setsid") is None, reason="device-bg.sh needs setsid (util-linux)")
def test_device_bg_resumes_on_a_fresh_host_from_a_carried_archive(tmp_path):
    """A host lost mid-run: its last packed archive (results and engine-start journals) seeds the
    next host's results folder, and the run there sees them; without --resume it is refused."""
    (tmp_path / "fake.sh").write_text(FAKE_RUN)
    out = tmp_path / "out"
    out.mkdir()
    carried = tmp_path / "carried"
    (carried / "m" / "sglang-0.5.17").mkdir(parents=True)
    (carried / "m" / "sglang-0.5.17" / "timing.jsonl").write_text("{}\n")
    (carried / "m" / "sglang-0.5.17" / "timing.jsonl.starts").write_text("{}\n")
    archive = tmp_path / "results.tgz"
    subprocess.run(["tar", "-czf", str(archive), "-C", str(carried), "."], check=True)
    name = f"sw-test-{os.getpid()}-resume"
    env = dict(os.environ, OUT=str(out), BG_SCRIPT=str(tmp_path / "fake.sh"), BG_NAME=name, RESUME_FROM=str(archive))
    script = str(ROOT / "scripts" / "device-bg.sh")
    try:
        refused = subprocess.run(["bash", script, "start", "c0ffee", "suites/timing.toml"], env=env, cwd=tmp_path,
                                 capture_output=True, text=True)  # fmt: skip
        assert refused.returncode == 2 and "needs --resume" in refused.stderr
        subprocess.run(["bash", script, "start", "c0ffee", "suites/timing.toml", "--resume"], env=env, cwd=tmp_path,
                       check=True, capture_output=True)  # fmt: skip
        waited = subprocess.run(["bash", script, "wait", "60"], env=env, cwd=tmp_path, capture_output=True, text=True)
        assert waited.returncode == 0, waited.stdout + waited.stderr
        with tarfile.open(out / f"{name}.tgz") as t:
            names = set(t.getnames())
        assert {"./m/sglang-0.5.17/timing.jsonl", "./m/sglang-0.5.17/timing.jsonl.starts", "./runs.txt"} <= names
    finally:
        subprocess.run(f"rm -rf /tmp/{name} /tmp/{name}-repo /tmp/{name}-out /tmp/{name}.*", shell=True)
