"""The device helpers in scripts/ (bash), driven here with a fake run script instead of specwatch."""
import os
import shutil
import subprocess
import tarfile
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
        subprocess.run(["bash", script, "start", "c0ffee", "suites/a.toml", "--where", "model=tiny attn",
                        "--then", "suites/b.toml", "--known", "results"],
                       env=dict(env, BG_NAME=names[0]), cwd=tmp_path, check=True, capture_output=True)
        subprocess.run(["bash", script, "start", "c0ffee", "suites/c.toml"],
                       env=dict(env, BG_NAME=names[1]), cwd=tmp_path, check=True, capture_output=True)
        waited = subprocess.run(["bash", script, "wait", "60", *names], env=env, cwd=tmp_path,
                                capture_output=True, text=True)
        assert waited.returncode == 0, waited.stdout + waited.stderr
        with tarfile.open(out / f"{names[0]}.tgz") as t:
            runs = t.extractfile("./runs.txt").read().decode().splitlines()
        # one run per segment, in order, the commit first and a quoted argument kept whole
        assert runs == ["c0ffee|suites/a.toml|--where|model=tiny attn|",
                        "c0ffee|suites/b.toml|--known|results|"]
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
        subprocess.run(["bash", "-c", f"set -m; bash {script} start c0ffee a.toml --then b.toml"],
                       env=env, cwd=tmp_path, check=True, capture_output=True)
        pid = int(Path(f"/tmp/{name}.pid").read_text())
        os.kill(pid, 0)                                        # the recorded pid is the running chain
        stopped = subprocess.run(["bash", script, "stop"], env=env, cwd=tmp_path, capture_output=True, text=True,
                                 timeout=30)
        assert "stopped" in stopped.stdout
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
        # the chain did not go on to its second run
        assert subprocess.run(["pgrep", "-f", f"{tmp_path}/slow.sh"], capture_output=True).returncode == 1
    finally:
        subprocess.run(f"rm -rf /tmp/{name} /tmp/{name}-repo /tmp/{name}-out /tmp/{name}.*", shell=True)
