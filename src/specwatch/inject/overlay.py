"""Commit overlays: run a git checkout of SGLang's Python code on top of an installed release.

``specwatch overlay REPO REV`` exports ``python/sglang`` of commit REV from a local SGLang git
repository into ``.overlay/<commit12>/python/sglang`` with an ``overlay.json`` beside it.
``specwatch run ... --overlay .overlay/<commit12>`` puts that ``python/`` first on the workers'
PYTHONPATH, so ``import sglang`` loads the commit's code, and records the run as
``sglang_version = <release>+g<commit12>`` (its own results file) and ``sglang_commit = <commit>``.

Limits: only SGLang's Python package is replaced. Compiled parts (sgl_kernel / sglang-kernel,
flashinfer, deep_gemm) and every other dependency come from the installed release, so a commit
whose Python code needs a newer kernel or dependency fails at import or first use (recorded as a
crash). Use commits of the installed release's line (same major.minor); ``build`` refuses others
unless forced. Files outside ``python/sglang`` (e.g. ``sgl-kernel/``, ``sgl-router/``) are ignored.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import tarfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

from specwatch.core.errors import SpecwatchInputError
from specwatch.core.sglang_host import COMMIT_ENV, VERSION_ENV

META = "overlay.json"


@dataclass(frozen=True)
class Overlay:
    """One exported commit."""

    root: str
    """Folder holding ``python/sglang`` and ``overlay.json``."""
    commit: str
    """Full commit hash."""
    code_version: Optional[str]
    """``__version__`` in the commit's ``python/sglang/version.py`` (None if absent)."""
    base_version: Optional[str]
    """Installed SGLang release the overlay was built against."""

    @property
    def recorded_version(self) -> str:
        return f"{self.base_version or self.code_version or 'unknown'}+g{self.commit[:12]}"

    def env(self, pythonpath: str = "") -> dict[str, str]:
        """Environment for workers (and the runner's provenance) that activates the overlay."""
        path = str(Path(self.root, "python").resolve())
        return {
            "PYTHONPATH": os.pathsep.join(p for p in (path, pythonpath) if p),
            VERSION_ENV: self.recorded_version,
            COMMIT_ENV: self.commit,
        }


def _line(version: Optional[str]) -> Optional[str]:
    m = re.match(r"(\d+)\.(\d+)", version or "")
    return f"{m.group(1)}.{m.group(2)}" if m else None


def build(repo: Path, rev: str, out: Path, base_version: Optional[str], force: bool = False) -> Overlay:
    """Export ``python/sglang`` at ``rev`` from git repository ``repo`` into ``out/<commit12>``."""

    def git(*args: str, binary: bool = False):
        res = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, check=False)
        if res.returncode != 0:
            raise SpecwatchInputError(
                repo, f"git {' '.join(args)}: {res.stderr.decode(errors='replace').strip()}", field="repo"
            )
        return res.stdout if binary else res.stdout.decode().strip()

    commit = git("rev-parse", "--verify", f"{rev}^{{commit}}")
    data = git("archive", "--format=tar", commit, "python/sglang", binary=True)
    root = Path(out) / commit[:12]
    tmp = root.with_name(root.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    with tarfile.open(fileobj=io.BytesIO(data)) as t:
        try:
            t.extractall(tmp, filter="data")
        except TypeError:  # Python without extraction filters (< 3.10.12): git archive output is plain
            t.extractall(tmp)
    version_file = tmp / "python" / "sglang" / "version.py"
    code_version = None
    if version_file.exists():
        m = re.search(r"__version__\s*=\s*['\"]([^'\"]+)['\"]", version_file.read_text())
        code_version = m.group(1) if m else None
    if not force and base_version and code_version and _line(code_version) != _line(base_version):
        shutil.rmtree(tmp, ignore_errors=True)
        raise SpecwatchInputError(
            repo,
            f"commit {commit[:12]} is SGLang {code_version}, the installed release is "
            f"{base_version}: an overlay needs the same line (or --force)",
            field="rev",
        )
    ov = Overlay(str(root), commit, code_version, base_version)
    (tmp / META).write_text(json.dumps(asdict(ov), indent=1) + "\n")
    shutil.rmtree(root, ignore_errors=True)
    tmp.rename(root)
    return ov


def load(path: Path) -> Overlay:
    meta = Path(path) / META
    try:
        data = json.loads(meta.read_text())
        ov = Overlay(**{**data, "root": str(path)})
    except (OSError, ValueError, TypeError) as e:
        raise SpecwatchInputError(meta, f"not a specwatch overlay ({type(e).__name__}: {e})", field="overlay") from None
    if not (Path(path) / "python" / "sglang" / "__init__.py").exists():
        raise SpecwatchInputError(path, "no python/sglang/__init__.py in the overlay", field="overlay")
    return ov
