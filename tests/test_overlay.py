"""Commit overlays on a synthetic SGLang repository: export, release-line check, the overlay's code
is what workers import, and runs are recorded under the overlay's version and commit."""

import os
import subprocess
import sys

import pytest

from specwatch.core.errors import SpecwatchInputError
from specwatch.inject.overlay import COMMIT_ENV, VERSION_ENV, build, load


def _git(repo, *args):
    return subprocess.run(
        ["git", "-C", str(repo), *args],
        check=True,
        capture_output=True,
        text=True,
        env={
            **os.environ,
            "GIT_AUTHOR_NAME": "t",
            "GIT_AUTHOR_EMAIL": "t@t",
            "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@t",
        },
    ).stdout.strip()


@pytest.fixture
def repo(tmp_path):
    r = tmp_path / "sglang"
    (r / "python" / "sglang").mkdir(parents=True)
    (r / "sgl-kernel").mkdir()
    (r / "sgl-kernel" / "big.cu").write_text("// not exported\n")
    _git(r, "init", "-q", "-b", "main")
    for version, marker in (("0.5.17", "release"), ("0.5.17", "fix"), ("0.6.0", "next")):
        (r / "python" / "sglang" / "version.py").write_text(f'__version__ = "{version}"\n')
        (r / "python" / "sglang" / "__init__.py").write_text(f'MARKER = "{marker}"\n')
        _git(r, "add", "-A")
        _git(r, "commit", "-q", "-m", marker)
    return r


def test_overlay_exports_the_commits_python_code_only(repo, tmp_path):
    fix = _git(repo, "rev-parse", "HEAD~1")
    ov = build(repo, "HEAD~1", tmp_path / "ov", base_version="0.5.17")
    assert ov.commit == fix and ov.code_version == "0.5.17" and ov.recorded_version == f"0.5.17+g{fix[:12]}"
    assert not list((tmp_path / "ov").rglob("big.cu"))
    assert load(ov.root) == ov
    env = ov.env(pythonpath="/elsewhere")
    assert env[COMMIT_ENV] == fix and env[VERSION_ENV] == ov.recorded_version
    out = subprocess.run(
        [sys.executable, "-c", "import sglang; print(sglang.MARKER)"],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
    ).stdout.strip()
    assert out == "fix"


def test_overlay_refuses_another_release_line_and_bad_input(repo, tmp_path):
    with pytest.raises(SpecwatchInputError, match="same line"):
        build(repo, "HEAD", tmp_path / "ov", base_version="0.5.17")
    assert build(repo, "HEAD", tmp_path / "ov", base_version="0.5.17", force=True).code_version == "0.6.0"
    with pytest.raises(SpecwatchInputError, match="rev-parse"):
        build(repo, "no-such-rev", tmp_path / "ov", base_version="0.5.17")
    with pytest.raises(SpecwatchInputError, match="overlay"):
        load(tmp_path / "nothing-here")


def test_run_under_an_overlay_records_its_version_and_commit(repo, tmp_path, monkeypatch):
    from specwatch.run.runner import RunOptions, run_suite
    from specwatch.store.jsonl import read_records
    from specwatch.suite import load_suite

    ov = build(repo, "HEAD~1", tmp_path / "ov", base_version="0.5.17")
    here = os.path.dirname(__file__)
    for k, v in ov.env(here + os.pathsep + os.environ.get("PYTHONPATH", "")).items():
        monkeypatch.setenv(k, v)
    s = tmp_path / "s.toml"
    s.write_text('[suite]\nname="ov"\nrepeats=1\n[[matrix]]\nattention_backend=["triton"]\npage_size=[64]\ntopk=[1]\n')
    out = run_suite(load_suite(s), tmp_path / "results", RunOptions(gpus=1, worker_module="fake_worker"))
    assert out.parent.name == f"sglang-{ov.recorded_version}"
    rec = next(iter(read_records(out)))
    assert rec.provenance.sglang_commit == ov.commit and rec.provenance.sglang_version == ov.recorded_version
