"""The code passes ruff's lint and its formatter's check (configuration in pyproject.toml)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PATHS = ["src", "tests", "benchmarks", "scripts"]


def test_ruff_finds_nothing_to_lint():
    res = subprocess.run([sys.executable, "-m", "ruff", "check", *PATHS], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_ruff_format_would_change_nothing():
    res = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", *PATHS], cwd=ROOT, capture_output=True, text=True
    )
    assert res.returncode == 0, res.stdout + res.stderr
