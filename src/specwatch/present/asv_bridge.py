"""specwatch records -> asv's native results, through asv's own runner (``specwatch asv-import``).

The offline GPU host cannot let asv build SGLang per commit, so this is the existing-environment
mode: for every (machine, SGLang version) in the store, ``asv run -E existing --set-commit-hash``
runs ``benchmarks/eagle_tree.py`` with ``SPECWATCH_SGLANG_VERSION`` / ``SPECWATCH_MACHINE`` set, and
its ``track_`` functions return the stored values. asv needs a repository that knows each commit
and its date, so SGLang versions are kept as commits of a small local "version ledger" repository
(one empty commit per version, dated in version order); ``asv publish`` and ``asv compare`` then
work unchanged on ``.asv/offline/results`` (the trend axis is the SGLang version).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from specwatch.core.sglang_host import VERSION_ENV, version_key

ROOT = Path(__file__).resolve().parents[3]
EPOCH = 1735689600
"""2025-01-01 UTC: the ledger's first version is dated here, each next one a day later."""


def _git(repo: Path, *args: str, env: dict | None = None) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env={**os.environ, **(env or {})}
    ).stdout.strip()


class OutOfOrderVersion(ValueError):
    """A version older than the ledger's newest: asv orders commits by date, so the ledger must be rebuilt."""


def version_ledger(repo: Path, versions: list[str]) -> dict[str, str]:
    """Commit hash of each SGLang version in the ledger repository (created / extended as needed)."""
    if not (repo / ".git").exists():
        repo.mkdir(parents=True, exist_ok=True)
        _git(repo, "init", "-q", "-b", "main")
    known: dict[str, str] = {}
    if _git(repo, "rev-list", "--all", "--count") != "0":
        for line in _git(repo, "log", "--format=%H %s", "main").splitlines():
            h, _, subject = line.partition(" ")
            known[subject.removeprefix("sglang ")] = h
    new = sorted((v for v in set(versions) if v not in known), key=version_key)
    if known and new and version_key(new[0]) < max(map(version_key, known)):
        raise OutOfOrderVersion(f"version {new[0]} is older than the ledger's newest; delete {repo} to rebuild it")
    for i, v in enumerate(new, start=len(known)):
        when = f"@{EPOCH + 86400 * i} +0000"  # one day per version: asv orders commits by date
        stamp = {
            "GIT_AUTHOR_DATE": when,
            "GIT_COMMITTER_DATE": when,
            "GIT_AUTHOR_NAME": "specwatch",
            "GIT_AUTHOR_EMAIL": "specwatch@localhost",
            "GIT_COMMITTER_NAME": "specwatch",
            "GIT_COMMITTER_EMAIL": "specwatch@localhost",
        }
        _git(repo, "commit", "-q", "--allow-empty", "-m", f"sglang {v}", env=stamp)
        known[v] = _git(repo, "rev-parse", "HEAD")
    return known


def offline_config(work: Path, ledger: Path, html_dir: Path) -> Path:
    cfg = {
        "version": 1,
        "project": "sglang",
        "project_url": "https://github.com/sgl-project/sglang",
        "repo": str(ledger.resolve()),
        "branches": ["main"],
        "environment_type": "existing",
        # one forked process per benchmark instead of a fresh interpreter: minutes -> seconds
        "launch_method": "forkserver",
        "benchmark_dir": str((ROOT / "benchmarks").resolve()),
        "results_dir": str((work / "results").resolve()),
        "html_dir": str(html_dir.resolve()),
    }
    path = work / "asv.offline.json"
    path.write_text(json.dumps(cfg, indent=1))
    return path


def _asv(cfg: Path, *args: str, env: dict | None = None) -> str:
    res = subprocess.run(
        [sys.executable, "-m", "asv", *args, "--config", str(cfg.resolve())],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        cwd=cfg.parent,
        timeout=1800,
    )
    if res.returncode != 0:
        raise RuntimeError(f"asv {' '.join(args)} failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    return res.stdout


ENV_LABEL = "specwatch"
"""The environment name asv's results carry. asv names an existing environment after its
interpreter's absolute path, so results would change with the checkout's location; the records
come from the store, not from this interpreter, so one fixed label serves every checkout."""


def stabilise_env_names(results_dir: Path) -> None:
    """Rewrite asv's results files under ``results_dir`` so their environment is ``ENV_LABEL``
    (file name, ``env_name``, ``python`` and the ``python`` parameter): published graphs then lie
    under ``python-specwatch`` wherever the checkout lives."""
    for f in Path(results_dir).glob("*/*-existing-*.json"):
        if f.name.endswith(f"-existing-{ENV_LABEL}.json"):
            continue  # written so by an earlier import
        d = json.loads(f.read_text())
        d["env_name"] = f"existing-{ENV_LABEL}"
        d["python"] = ENV_LABEL
        d.setdefault("params", {})["python"] = ENV_LABEL
        target = f.with_name(f"{d['commit_hash'][:8]}-existing-{ENV_LABEL}.json")
        target.write_text(json.dumps(d, indent=None, separators=(",", ":")))
        if target != f:
            f.unlink()


def tree_page_pairs(results_root: Path) -> list[tuple[str, str]]:
    """(machine, SGLang version) of every clean tree-page results file in the store, from its path
    (``MACHINE/sglang-VERSION/tree-page.jsonl``): no record is parsed to find them."""
    pairs = set()
    for f in Path(results_root).glob("*/sglang-*/tree-page.jsonl"):
        if f.is_file() and f.stat().st_size:
            pairs.add((f.parent.parent.name, f.parent.name.removeprefix("sglang-")))
    return sorted(pairs, key=lambda mv: (mv[0], version_key(mv[1])))


def asv_import(
    results_root: Path,
    work: Path = Path(".asv/offline"),
    html_dir: Path = Path("dashboards/asv"),
    publish: bool = True,
    log=None,
    bench: str = "EagleTree",
) -> dict[tuple[str, str], str]:
    """Write asv results for every (machine, SGLang version) that has tree-page records; returns
    {(machine, version): ledger commit}. ``asv publish`` writes the HTML into ``html_dir``. ``log``
    hears one line per step (each version's asv run reads that version's own results file once).
    ``bench``: asv's ``--bench`` regex (names with their parameters), all EagleTree tracks by default."""
    say = log or (lambda line: None)
    work.mkdir(parents=True, exist_ok=True)
    pairs = tree_page_pairs(results_root)
    try:
        hashes = version_ledger(work / "sglang-versions", [v for _, v in pairs])
    except OutOfOrderVersion:
        # the ledger and asv's results under WORK are derived from the records: rebuild them with
        # the older version in its place (every pair's results are rewritten below anyway)
        for derived in ("sglang-versions", "results"):
            shutil.rmtree(work / derived, ignore_errors=True)
        hashes = version_ledger(work / "sglang-versions", [v for _, v in pairs])
    cfg = offline_config(work, work / "sglang-versions", html_dir)
    done: dict[tuple[str, str], str] = {}
    for i, (machine, version) in enumerate(pairs, start=1):
        started = time.monotonic()
        env = {
            VERSION_ENV: version,
            "SPECWATCH_MACHINE": machine,
            "SPECWATCH_RESULTS": str(Path(results_root).resolve()),
        }
        _asv(cfg, "machine", "--yes", "--machine", machine, env=env)
        _asv(
            cfg,
            "run",
            "-E",
            f"existing:{sys.executable}",
            "--set-commit-hash",
            hashes[version],
            "--machine",
            machine,
            "--bench",
            bench,
            "--quick",
            env=env,
        )
        done[(machine, version)] = hashes[version]
        say(
            f"[{i}/{len(pairs)}] {machine} sglang {version}: asv commit {hashes[version][:8]} "
            f"({time.monotonic() - started:.0f} s)"
        )
    stabilise_env_names(work / "results")
    if publish and done:
        say("asv publish ...")
        _asv(cfg, "publish")
    return done
