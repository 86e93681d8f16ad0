"""specwatch records -> asv's native results, through asv's own runner (``specwatch asv-import``).

The offline GPU host cannot let asv build SGLang per commit, so this is the existing-environment
mode: for every (machine, SGLang version) in the store, the version's tree-page records are read
once (``tree_page_cases``) into a small cases file under the asv work folder, and ``asv run -E
existing --set-commit-hash`` runs ``benchmarks/eagle_tree.py`` over exactly the recorded cases
(``bench_regex``; every other case of the grid stays n/a) with ``SPECWATCH_ASV_CASES`` naming that
file, so its ``track_`` functions return the stored values without parsing a record. asv needs a
repository that knows each commit and its date, so SGLang versions are kept as commits of a small local "version ledger" repository
(one empty commit per version, dated in version order); ``asv publish`` and ``asv compare`` then
work unchanged on ``.asv/offline/results`` (the trend axis is the SGLang version).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from specwatch.core.sglang_host import VERSION_ENV, version_key
from specwatch.store.jsonl import load_records, result_files, results_path
from specwatch.store.latest import latest_by_case

ROOT = Path(__file__).resolve().parents[3]
EPOCH = 1735689600
"""2025-01-01 UTC: the ledger's first version is dated here, each next one a day later."""


CASES_ENV = "SPECWATCH_ASV_CASES"
"""Names the cases file (``write_cases``) the EagleTree benchmarks read instead of the store."""

TRACKED = ("decode_throughput", "accept_length", "req_to_token_bytes", "leaked_tokens", "lossless_mismatches")
"""The tree-page metrics the EagleTree benchmarks track (one asv ``track_`` each)."""

CaseKey = tuple[str, int, int, int, str]
"""An EagleTree case as asv names it: (backend, page_size, topk, batch_size, profile)."""


def tree_page_cases(root: Path, version: str, machine: Optional[str] = None) -> dict[CaseKey, dict[str, float]]:
    """The tracked metric values of each case's latest ok clean tree-page record of SGLang
    ``version`` (on ``machine``: only its own results file is read; None: every machine's). Runs
    whose starts overlapped other engines' timed batches are left out: not a trend point; so are
    own models' records, which the oracle grid of the benchmarks (no model parameter) has no place for."""
    files = (
        [results_path(root, machine, version, "tree-page")]
        if machine
        else [f for f in result_files(root) if f.name == "tree-page.jsonl"]
    )
    chosen = latest_by_case(
        r
        for r in load_records(f for f in files if f.exists())
        if r.suite == "tree-page"
        and r.provenance.sglang_version == version
        and r.status.value == "ok"
        and r.provenance.fault is None
        and (machine is None or r.provenance.machine == machine)
        and not r.overlap_starts
        and r.case.own_model is None  # EagleTree's cases name no model: an own model's would take an oracle's place
    )
    return {
        (r.case.attention_backend.value, r.case.page_size, r.case.topk, r.case.batch_size, r.case.profile.value): {
            m: r.metrics[m].value for m in TRACKED if m in r.metrics and r.metrics[m].value is not None
        }
        for r in chosen.values()
    }


def write_cases(path: Path, cases: dict[CaseKey, dict[str, float]]) -> Path:
    """``cases`` as the JSON file ``read_cases`` reads (sorted: the same store gives the same file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(sorted([list(k), v] for k, v in cases.items())))
    return path


def read_cases(path: Path) -> dict[CaseKey, dict[str, float]]:
    """The cases file ``write_cases`` wrote."""
    return {tuple(k): v for k, v in json.loads(Path(path).read_text())}


def bench_regex(cases) -> str:
    """asv's ``--bench`` regex for every EagleTree track of exactly ``cases`` (asv's parameter
    names: strings quoted, numbers bare), so asv runs no benchmark that could only answer n/a."""
    names = sorted("(" + ", ".join(repr(v) for v in key) + ")" for key in cases)
    return r"EagleTree\.track_\w+(?:" + "|".join(re.escape(n) for n in names) + ")$"


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


def _asv(cfg: Path, *args: str, env: dict | None = None, on_line: Callable[[str], None] = lambda line: None) -> str:
    """Run ``asv ARGS`` on ``cfg``; ``on_line`` hears each line of its output as it comes."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "asv", *args, "--config", str(cfg.resolve())],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        cwd=cfg.parent,
    )
    lines = []
    for line in proc.stdout:
        lines.append(line)
        on_line(line)
    if proc.wait(timeout=1800) != 0:
        raise RuntimeError(f"asv {' '.join(args[:1])} failed:\n{''.join(lines)[-6000:]}")
    return "".join(lines)


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


TRACK_DONE = re.compile(r"^\[\s*[\d.]+%\] ·+ \S*EagleTree\.track_")
"""asv's line for one track finished (over every case of the run)."""


def asv_import(
    results_root: Path,
    work: Path = Path(".asv/offline"),
    html_dir: Path = Path("dashboards/asv"),
    publish: bool = True,
    log=None,
    console: Optional[Console] = None,
) -> dict[tuple[str, str], str]:
    """Write asv results for every (machine, SGLang version) that has ok tree-page records; returns
    {(machine, version): ledger commit}. ``asv publish`` writes the HTML into ``html_dir``. ``log``
    hears one line per step; ``console``: where a progress bar (one step per asv track run) is drawn."""
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
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        disable=console is None,
    )
    with progress:
        task = progress.add_task("asv-import", total=len(pairs) * len(TRACKED))
        for machine in sorted({m for m, _ in pairs}):
            _asv(cfg, "machine", "--yes", "--machine", machine)
        for i, (machine, version) in enumerate(pairs, start=1):
            started = time.monotonic()
            progress.update(task, description=f"{machine} sglang {version}")
            if _import_pair(results_root, work, cfg, machine, version, hashes[version], progress, task):
                done[(machine, version)] = hashes[version]
                said = f"asv commit {hashes[version][:8]}"
            else:
                said = "no ok tree-page record: nothing for asv"
            progress.update(task, completed=i * len(TRACKED))
            say(f"[{i}/{len(pairs)}] {machine} sglang {version}: {said} ({time.monotonic() - started:.0f} s)")
        stabilise_env_names(work / "results")
        if publish and done:
            progress.update(task, description="asv publish")
            say("asv publish ...")
            _asv(cfg, "publish")
    return done


def _import_pair(
    root: Path, work: Path, cfg: Path, machine: str, version: str, commit: str, progress: Progress, task
) -> bool:
    """One (machine, version)'s asv run over its recorded cases (False: it has none). The commit's
    earlier asv results are removed first: they are derived from the records, and a case that
    has lost its ok record must read n/a, not its old value."""
    cases = tree_page_cases(Path(root), version, machine)
    for old in (work / "results" / machine).glob(f"{commit[:8]}-*.json"):
        old.unlink()
    if not cases:
        return False
    path = write_cases(work / "cases" / machine / f"sglang-{version}.json", cases)
    env = {
        VERSION_ENV: version,
        "SPECWATCH_MACHINE": machine,
        CASES_ENV: str(path.resolve()),
        # asv drops PYTHONPATH: the benchmarks read the cases file with this same specwatch
        "ASV_PYTHONPATH": str(Path(__file__).resolve().parents[2]),
    }
    args = ("run", "-E", f"existing:{sys.executable}", "--set-commit-hash", commit, "--machine", machine)
    _asv(
        cfg,
        *args,
        "--bench",
        bench_regex(cases),
        "--quick",
        env=env,
        on_line=lambda line: progress.advance(task) if TRACK_DONE.match(line) else None,
    )
    return True
