"""Hardening harness: bad inputs and faults tried against the real ``specwatch`` CLI.

Every trial runs the CLI in a child process (``python -m specwatch.cli`` with this checkout's
``src`` first on PYTHONPATH) inside its own scratch folder, and is judged *handled* when the
command exits 2, prints no traceback, prints exactly one error line (typer's usage framing
aside), that line names the file or option at fault, and nothing was written outside the
results root or output the command was given. Store-damage trials also count a clean exit 0
that names the damaged file (a warning) as handled.

Fault trials start a sweep of the fake worker (``tests/fake_worker.py``) through
``specwatch.run.runner.run_suite``, send SIGKILL, SIGTERM or SIGINT to the runner mid-sweep,
then finish it with ``resume=True``; they report whether the store stayed readable and the
resumed sweep completed (survived), cases with no ok record (lost), cases with more than one ok
record (duplicated) and worker processes still alive after the runner exited (orphans).

Trials run in a thread pool (each thread waits on its child process), so the harness uses every
core; the variants are generated in a fixed order and the table is sorted, so two runs print the
same table. Exit status 0 when every trial was handled and every fault trial survived cleanly.

    python scripts/hardening.py                 # everything
    python scripts/hardening.py --only suite:   # classes whose name starts with "suite:"
    python scripts/hardening.py --failures      # also list each trial not handled, and why
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src"
TESTS = REPO / "tests"
SMOKE = REPO / "suites" / "smoke.toml"
TEMPLATE_RECORDS = REPO / "results" / "nvidia-h200-x1" / "sglang-0.5.17" / "smoke.jsonl"
ONE_CASE = ["--where", "page_size=64", "--where", "topk=1", "--where", "attention_backend=triton"]
"""Narrows smoke.toml to one case, so a run the CLI lets through costs one CPU-tier case, not eight."""
TRIAL_TIMEOUT_S = 90
"""A trial running longer than this is killed and counted not handled (a hang is no clear error)."""
MEMORY_LIMIT = 6 << 30
"""Address-space limit of each CLI child: an input that makes the CLI allocate without bound fails
the trial (MemoryError) instead of the host."""
UNPRIVILEGED = 65534
"""uid/gid the read-only trials run as when the harness runs as root (root writes read-only folders)."""
MARKER = "SPECWATCH_HARDENING_TRIAL"
"""Environment variable set in every child: processes still carrying it after a trial are orphans."""
BOX = str.maketrans("", "", "╭╮╰╯│─┃━┏┓┗┛")


# ----------------------------------------------------------------------------- trials


@dataclass
class Trial:
    """One bad input: the CLI arguments and the files it needs, built in the trial's folder.

    Paths in ``argv``, ``files`` and ``names`` may use ``{T}`` (the trial folder), ``{R}`` (the
    results root, three levels down so that ``../`` traversal lands inside ``{T}``) and ``{O}``
    (the output folder)."""

    klass: str
    variant: str
    argv: list[str]
    names: str
    """Text the error line must contain (a path or an option name)."""
    files: dict[str, str | bytes] = field(default_factory=dict)
    setup: Optional[Callable[[Path, Path], None]] = None
    """Extra preparation, given the trial folder and the results root."""
    tolerate: bool = False
    """Store damage: exit 0 with a line naming ``names`` also counts as handled."""
    unprivileged: bool = False
    also: str = ""
    """A regular expression the error line must match too (e.g. the bad line's number)."""


@dataclass
class Outcome:
    """What one trial did and the verdict."""

    klass: str
    variant: str
    handled: bool
    why: str
    wall_s: float


def _suite(
    header: str = 'name = "t"',
    matrix: str = 'attention_backend = ["triton"]\npage_size = [1]\ntopk = [1]',
    extra: str = "",
) -> str:
    return f"[suite]\n{header}\n{extra}\n[[matrix]]\n{matrix}\n"


MATRIX_INTS = {
    "page_size": 4096,
    "topk": 64,
    "num_steps": 32,
    "num_draft_tokens": 1024,
    "tp": 64,
    "dcp": 64,
    "batch_size": 4096,
    "input_len": 8192,
    "output_len": 8192,
}
"""Numeric matrix axes and their upper bounds (``specwatch.suite.AXIS_BOUNDS``)."""
MATRIX_ENUMS = ("model", "algorithm", "attention_backend", "profile", "workload")


def _matrix_with(key: str, value: str) -> str:
    base = {"attention_backend": '["triton"]', "page_size": "[1]", "topk": "[1]"}
    base[key] = value
    return "\n".join(f"{k} = {v}" for k, v in base.items())


def _plan(klass: str, variant: str, text: str | bytes) -> Trial:
    return Trial(klass, variant, ["plan", "{T}/in/s.toml"], "{T}/in/s.toml", files={"in/s.toml": text})


def suite_trials() -> list[Trial]:
    """Bad suite files: syntax, unknown keys, wrong types, bounds, empty tables, huge products, names."""
    out = [
        _plan("suite: TOML syntax", v, t)
        for v, t in [
            ("unclosed table", "[suite\nname="),
            ("missing value", "[suite]\nname =\n"),
            ("duplicate key", '[suite]\nname = "a"\nname = "b"\n'),
            ("unterminated string", '[suite]\nname = "a\n'),
            ("not UTF-8", b"\xff\xfe[suite]\n"),
            ("binary", bytes(range(256))),
        ]
    ]
    out += [
        _plan("suite: unknown key", v, t)
        for v, t in [
            ("suite.bogus", _suite(extra="bogus = 1")),
            ("matrix.bogus", _suite(matrix=_matrix_with("bogus", "[1]"))),
            ("top-level table", _suite() + "[extra]\na = 1\n"),
            ("typo page_sizes", _suite(matrix=_matrix_with("page_sizes", "[1]"))),
        ]
    ]
    wrong = ["[true]", '["64"]', "[8.0]", "64", '"64"']
    out += [
        _plan("suite: wrong type", f"{k} = {w}", _suite(matrix=_matrix_with(k, w))) for k in MATRIX_INTS for w in wrong
    ]
    out += [
        _plan("suite: wrong type", f"cuda_graph = {w}", _suite(matrix=_matrix_with("cuda_graph", w)))
        for w in ('["yes"]', "[1]", "true", "[0.0]")
    ]
    out += [
        _plan("suite: wrong type", f"{k} = {w}", _suite(matrix=_matrix_with(k, w)))
        for k in MATRIX_ENUMS
        for w in ('["nope"]', "[1]", '"triton"')
    ]
    header = [
        "name = 1",
        "name = true",
        'name = ["t"]',
        "description = 1",
        "repeats = true",
        'repeats = "3"',
        "repeats = 3.0",
        'warmup = "yes"',
        "warmup = 1",
        'timeout_s = "900"',
        "timeout_s = 900.5",
        'max_cases = "10"',
        "max_cases = true",
    ]
    out += [
        _plan("suite: wrong type", h, _suite(header="" if h.startswith("name") else 'name = "t"', extra=h))
        for h in header
    ]
    out += [
        _plan("suite: wrong type", v, t)
        for v, t in [
            ("matrix is a table", '[suite]\nname = "t"\n[matrix]\npage_size = [1]\n'),
            (
                "suite is a string",
                'suite = "t"\n[[matrix]]\nattention_backend = ["triton"]\npage_size = [1]\ntopk = [1]\n',
            ),
        ]
    ]
    for k, hi in MATRIX_INTS.items():
        for v in (0, -1, hi + 1, 10**23):
            out.append(_plan("suite: out of bounds", f"{k} = [{v}]", _suite(matrix=_matrix_with(k, f"[{v}]"))))
    for h in (
        "repeats = 0",
        "repeats = 1000000000",
        "timeout_s = 0",
        "timeout_s = -1",
        "timeout_s = 10000000000",
        "max_cases = 0",
        "max_cases = 10000000",
    ):
        out.append(_plan("suite: out of bounds", h, _suite(extra=h)))
    out += [
        _plan("suite: empty", v, t)
        for v, t in [
            ("empty file", ""),
            ("matrix = []", '[suite]\nname = "t"\nmatrix = []\n'),
            ("no matrix", '[suite]\nname = "t"\n'),
            ("no [suite]", '[[matrix]]\nattention_backend = ["triton"]\n'),
            ("page_size = []", _suite(matrix=_matrix_with("page_size", "[]"))),
            ("attention_backend missing", _suite(matrix="page_size = [1]\ntopk = [1]")),
        ]
    ]
    ten = "[" + ", ".join(str(2**i) for i in range(10)) + "]"
    big7 = "\n".join(f"{k} = {ten}" for k in ("page_size", "batch_size", "input_len", "output_len", "num_steps"))
    out += [
        _plan("suite: huge product", v, t)
        for v, t in [
            (
                "10^7 cases",
                _suite(
                    matrix='attention_backend = ["triton"]\ntopk = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]\n'
                    "tp = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]\n" + big7
                ),
            ),
            (
                "10^5 + 1 over two matrices",
                _suite(
                    matrix='attention_backend = ["triton"]\ntopk = [1]\npage_size = [1]\nbatch_size = [1, 2, 3, 4, 5]\n'
                    + "\n".join(f"{k} = {ten}" for k in ("input_len", "output_len", "num_steps", "tp"))
                )
                + '[[matrix]]\nattention_backend = ["triton"]\ntopk = [1]\npage_size = [1]\n'
                "batch_size = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]\ninput_len = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]\n"
                "output_len = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]\nnum_steps = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]\n"
                "tp = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]\n",
            ),
            (
                "max_cases = 3 for 4 cases",
                _suite(
                    extra="max_cases = 3", matrix='attention_backend = ["triton"]\npage_size = [1, 64]\ntopk = [1, 2]'
                ),
            ),
        ]
    ]
    for h in (
        "engine_starts = 0",
        "engine_starts = 51",
        'engine_starts = "3"',
        "engine_starts = 2.0",
        "min_timed_s = -1.0",
        'min_timed_s = "2"',
        "min_timed_s = 601.0",
        "ci_half_width = 2.0",
        "ci_half_width = -0.01",
        'ci_half_width = "1%"',
        "max_repeats = 0",
        "max_repeats = true",
        "pin_cores = 1",
        'pin_cores = "yes"',
        "step_times = 1",
        'speedup = "true"',
    ):
        out.append(_plan("suite: timing keys", h, _suite(extra=h)))
    out += [
        _plan("suite: serving", v, _suite(matrix=m))
        for v, m in [
            ("serving_prompts without the serving workload", _matrix_with("serving_prompts", "[64]")),
            ("serving_prompts = [0]", _matrix_with("serving_prompts", "[0]") + '\nworkload = ["serving"]'),
            ('serving_prompts = ["64"]', _matrix_with("serving_prompts", '["64"]') + '\nworkload = ["serving"]'),
            ('workload = ["serve"]', _matrix_with("workload", '["serve"]')),
        ]
    ]
    for v, name in [
        ("traversal ../", "../../../escape"),
        ("absolute path", "/tmp/specwatch-hardening-escape"),
        ("slash", "a/b"),
        ("empty", ""),
        ("leading dot", ".hidden"),
        ("space", "a b"),
        ("backslash", "a\\\\b"),
        ("leading dash", "-rf"),
        ("200 characters", "a" * 200),
        ("non-ASCII", "névé"),
        ("plus (fault file separator)", "a+fault-x"),
        ("newline", "a\\nb"),
    ]:
        out.append(_plan("suite: bad name", v, _suite(header=f'name = "{name}"')))
        if v in ("traversal ../", "absolute path"):
            out.append(
                Trial(
                    "suite: bad name",
                    v + " (CPU tier run)",
                    ["run", "{T}/in/s.toml", "--cpu-tier", "--out", "{O}"],
                    "{T}/in/s.toml",
                    files={"in/s.toml": _suite(header=f'name = "{name}"')},
                )
            )
    return out


def option_trials() -> list[Trial]:
    """Bad --where / --shard / --page / --requests values."""
    out = [
        Trial("option: --where", w or "(empty)", ["plan", str(SMOKE), "--where", w], "--where")
        for w in ("bogus", "page_size", "=1", "nosuch=1", "page_size=", "", "case_id", "topk=1,,", "model=a b")
    ]
    out.append(
        Trial(
            "option: --where",
            "bogus (run)",
            ["run", str(SMOKE), "--cpu-tier", "--out", "{O}", "--where", "bogus"],
            "--where",
        )
    )
    out.append(
        Trial(
            "option: --where",
            "page_size=x (run)",
            ["run", str(SMOKE), "--cpu-tier", "--out", "{O}", "--where", "page_size=x"],
            "--where",
        )
    )
    out += [
        Trial(
            "option: --shard", s or "(empty)", ["run", str(SMOKE), "--shard", s, "--out", "{O}", *ONE_CASE], "--shard"
        )
        for s in ("0/3", "4/3", "x", "1/0", "-1/2", "1/2/3", "", "a/b", "1.5/2")
    ]
    for cmd in ("memory", "simulate"):
        out += [
            Trial("option: --page", f"model {cmd} --page {p}", ["model", cmd, "--page", p], "--page")
            for p in ("0", "-1", "x", "1.5", str(10**23))
        ]
    out += [
        Trial("option: --requests", f"--requests {r}", ["model", "simulate", "--requests", r], "--requests")
        for r in ("0", "-1", "x", "1.5", str(10**12))
    ]
    return out


def missing_trials() -> list[Trial]:
    """Every command that reads a file or folder, pointed at one that does not exist."""
    n = "{T}/missing"
    cases = [
        ("plan", ["plan", f"{n}.toml"], f"{n}.toml"),
        ("run", ["run", f"{n}.toml", "--out", "{O}"], f"{n}.toml"),
        ("import file", ["import", f"{n}.jsonl", "--results", "{R}"], f"{n}.jsonl"),
        ("import folder", ["import", f"{n}/", "--results", "{R}"], n),
        ("results", ["results", n], n),
        ("compare", ["compare", f"{n}.jsonl", f"{n}2.jsonl"], f"{n}.jsonl"),
        (
            "compare --budgets",
            ["compare", str(TEMPLATE_RECORDS), str(TEMPLATE_RECORDS), "--budgets", f"{n}.json"],
            f"{n}.json",
        ),
        ("dashboard --results", ["dashboard", "--results", n, "--out", "{O}"], n),
        ("noise", ["noise", f"{n}.jsonl", f"{n}2.jsonl"], f"{n}.jsonl"),
        ("noise-holdout", ["noise-holdout", f"{n}.json"], f"{n}.json"),
        ("asv-import", ["asv-import", "--results", n, "--work", "{O}/w", "--html", "{O}/h", "--no-publish"], n),
        ("overhead", ["overhead", "--results", n], n),
        ("roofline", ["roofline", n], n),
        ("run --overlay", ["run", str(SMOKE), "--overlay", n, "--out", "{O}", *ONE_CASE], n),
        ("overlay repo", ["overlay", n, "HEAD", "--out", "{O}"], n),
        ("plan --known", ["plan", str(SMOKE), "--known", n, "--machine", "m", "--sglang-version", "0.5.17"], n),
    ]
    return [Trial("missing file/dir", v, argv, name) for v, argv, name in cases]


def _template() -> dict:
    return json.loads(TEMPLATE_RECORDS.read_text().splitlines()[0])


def _with(path: str, value) -> str:
    rec = _template()
    keys = path.split(".")
    d = rec
    for k in keys[:-1]:
        d = d[k]
    d[keys[-1]] = value
    return json.dumps(rec) + "\n"


def import_trials() -> list[Trial]:
    """Bad record files for ``specwatch import``."""
    good = json.dumps(_template())
    deep = "[" * 100_000 + "]" * 100_000
    nan = good.replace('"value":', '"value":NaN,"x":', 1)
    variants = [
        ("not JSON", "garbage\n"),
        ("a list", "[1, 2]\n"),
        ("a number", "42\n"),
        ("a string", '"s"\n'),
        ("null", "null\n"),
        ("deep nesting (list)", deep + "\n"),
        ("deep nesting (object)", '{"a":' * 50_000 + "1" + "}" * 50_000 + "\n"),
        ("schema-invalid: unknown object", '{"a": 1}\n'),
        ("schema-invalid: status", _with("status", "bogus")),
        ("schema-invalid: page_size string", _with("case.page_size", "64")),
        ("schema-invalid: newer schema_version", _with("schema_version", 999)),
        ("NaN metric", nan),
        ("Infinity metric", good.replace('"value":', '"value":Infinity,"x":', 1)),
        ("traversal: machine ../", _with("provenance.machine", "../../../escape")),
        ("traversal: machine absolute", _with("provenance.machine", "{T}/abs-escape")),
        ("traversal: suite ../", _with("suite", "../../../escape")),
        ("traversal: suite a/b", _with("suite", "a/b")),
        ("traversal: sglang_version ../", _with("provenance.sglang_version", "../../../escape")),
        ("traversal: fault ../", _with("provenance.fault", "../../../escape")),
        ("not UTF-8", b"\xff\xfe\n"),
    ]
    out = [
        Trial(
            "import: bad records",
            v,
            ["import", "{T}/in/bad.jsonl", "--results", "{R}"],
            "{T}/in/bad.jsonl",
            files={"in/bad.jsonl": t},
        )
        for v, t in variants
    ]
    lines = [good] * 20
    lines[16] = good[: len(good) // 2]
    out.append(
        Trial(
            "import: bad records",
            "bad line 17 of 20",
            ["import", "{T}/in/bad.jsonl", "--results", "{R}"],
            "{T}/in/bad.jsonl",
            files={"in/bad.jsonl": "\n".join(lines) + "\n"},
            also=r"\b17\b",
        )
    )
    return out


def _store(T: Path, R: Path) -> Path:
    """A valid results root with one record file; returns its version folder."""
    d = R / "m" / "sglang-0.5.17"
    d.mkdir(parents=True, exist_ok=True)
    (d / "smoke.jsonl").write_text(TEMPLATE_RECORDS.read_text().splitlines()[0] + "\n")
    return d


def _torn_runs(T: Path, R: Path) -> None:
    (_store(T, R) / "runs.ndjson").write_text('{"run_id": "a", "wall')


def _torn_records(T: Path, R: Path) -> None:
    with open(_store(T, R) / "smoke.jsonl", "a") as f:
        f.write(TEMPLATE_RECORDS.read_text().splitlines()[0][:200])


def _dir_jsonl(T: Path, R: Path) -> None:
    (_store(T, R) / "x.jsonl").mkdir()


def _dangling(T: Path, R: Path) -> None:
    (_store(T, R) / "y.jsonl").symlink_to(T / "nowhere.jsonl")


def _runs_dir(T: Path, R: Path) -> None:
    (_store(T, R) / "runs.ndjson").mkdir()


def store_trials() -> list[Trial]:
    """A damaged results store read by ``results`` and ``dashboard``."""
    damage = [
        ("torn runs.ndjson", _torn_runs, "runs.ndjson"),
        ("torn last record", _torn_records, "smoke.jsonl"),
        ("folder named x.jsonl", _dir_jsonl, "x.jsonl"),
        ("dangling symlink", _dangling, "y.jsonl"),
        ("folder named runs.ndjson", _runs_dir, "runs.ndjson"),
    ]
    out = []
    for v, fn, name in damage:
        out.append(Trial("store damage", f"{v} (results)", ["results", "{R}"], name, setup=fn, tolerate=True))
        out.append(
            Trial(
                "store damage",
                f"{v} (dashboard)",
                ["dashboard", "--results", "{R}", "--out", "{O}"],
                name,
                setup=fn,
                tolerate=True,
            )
        )
    return out


def _readonly(path_of: Callable[[Path, Path], Path]) -> Callable[[Path, Path], None]:
    """A setup making ``path_of(T, R)`` unwritable: a read-only bind mount of it onto itself where
    this process may mount (root ignores file modes: the kernel refuses the write with EROFS, the
    product's own error path), else read-only modes for a trial run as an unprivileged user."""

    def setup(T: Path, R: Path) -> None:
        _store(T, R)
        p = path_of(T, R)
        p.mkdir(parents=True, exist_ok=True)
        if not readonly_mount(p):
            for q in [p, *p.rglob("*")]:
                q.chmod(0o555 if q.is_dir() else 0o444)

    return setup


def readonly_mount(p: Path) -> bool:
    """Bind-mount ``p`` onto itself read-only; False where mounting is not allowed here."""
    if os.geteuid() != 0 or not shutil.which("mount"):
        return False
    if subprocess.run(["mount", "--bind", str(p), str(p)], capture_output=True).returncode:
        return False
    if subprocess.run(["mount", "-o", "remount,ro,bind", str(p)], capture_output=True).returncode:
        subprocess.run(["umount", str(p)], capture_output=True)
        return False
    return True


def unmount_under(root: Path) -> None:
    """Undo every mount at or under ``root`` (innermost first)."""
    top = str(root.resolve())
    try:
        points = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    except OSError:
        return
    for m in sorted((m for m in points if m == top or m.startswith(top + "/")), key=len, reverse=True):
        subprocess.run(["umount", m], capture_output=True)


_MOUNTS: list[bool] = []


def can_mount_readonly() -> bool:
    """Whether ``readonly_mount`` works here (tried once on a scratch folder)."""
    if not _MOUNTS:
        d = Path(tempfile.mkdtemp(prefix="hd-ro-"))
        ok = readonly_mount(d)
        if ok:
            ok = not os.access(d, os.W_OK) or _write_refused(d)
            unmount_under(d)
        shutil.rmtree(d, ignore_errors=True)
        _MOUNTS.append(ok)
    return _MOUNTS[0]


def _write_refused(d: Path) -> bool:
    try:
        (d / "probe").write_text("x")
    except OSError:
        return True
    return False


def _store_only(T: Path, R: Path) -> None:
    _store(T, R)


def _results_file(T: Path, R: Path) -> None:
    R.parent.mkdir(parents=True, exist_ok=True)
    R.write_text("not a folder\n")


def unwritable_trials() -> list[Trial]:
    """Targets the command cannot write: read-only folders, missing parents, a file where a folder goes."""
    rec = str(TEMPLATE_RECORDS)
    ro = _readonly(lambda T, R: T / "ro")
    cases = [
        ("import into read-only results", ["import", rec, "--results", "{R}"], "{R}", _readonly(lambda T, R: R), True),
        ("import: results root is a file", ["import", rec, "--results", "{R}"], "{R}", _results_file, False),
        ("compare -o missing dir", ["compare", rec, rec, "-o", "{T}/no/such/r.md"], "{T}/no/such/r.md", None, False),
        ("compare -o read-only dir", ["compare", rec, rec, "-o", "{T}/ro/r.md"], "{T}/ro/r.md", ro, True),
        ("noise -o missing dir", ["noise", rec, rec, "-o", "{T}/no/such/b.json"], "{T}/no/such/b.json", None, False),
        ("noise -o read-only dir", ["noise", rec, rec, "-o", "{T}/ro/b.json"], "{T}/ro/b.json", ro, True),
        (
            "results --csv missing dir",
            ["results", "{R}", "--csv", "{T}/no/such/x.csv"],
            "{T}/no/such/x.csv",
            _store_only,
            False,
        ),
        (
            "model memory --csv missing dir",
            ["model", "memory", "--csv", "{T}/no/such/x.csv"],
            "{T}/no/such/x.csv",
            None,
            False,
        ),
        (
            "model memory --json missing dir",
            ["model", "memory", "--json", "{T}/no/such/x.json"],
            "{T}/no/such/x.json",
            None,
            False,
        ),
        (
            "run --cpu-tier --out read-only",
            ["run", str(SMOKE), "--cpu-tier", "--out", "{T}/ro", *ONE_CASE],
            "{T}/ro",
            ro,
            True,
        ),
        (
            "run --cpu-tier --out is a file",
            ["run", str(SMOKE), "--cpu-tier", "--out", "{T}/in/f", *ONE_CASE],
            "{T}/in/f",
            None,
            False,
        ),
        ("dashboard --out read-only", ["dashboard", "--results", "{R}", "--out", "{T}/ro"], "{T}/ro", ro, True),
        (
            "asv-import --work read-only",
            ["asv-import", "--results", "{R}", "--work", "{T}/ro/w", "--html", "{O}/h", "--no-publish"],
            "{T}/ro",
            ro,
            True,
        ),
    ]
    mounts = can_mount_readonly()  # then no trial needs another user (whose interpreter may be out of reach)
    return [
        Trial(
            "unwritable target",
            v,
            argv,
            name,
            setup=setup,
            unprivileged=unpriv and not mounts,
            files={"in/f": "a file\n"},
        )
        for v, argv, name, setup, unpriv in cases
    ]


CLASSES: dict[str, Callable[[], list[Trial]]] = {
    "suite": suite_trials,
    "option": option_trials,
    "missing": missing_trials,
    "import": import_trials,
    "store": store_trials,
    "unwritable": unwritable_trials,
}


def all_trials(only: str = "") -> list[Trial]:
    """Every trial whose class starts with ``only``, in a fixed order."""
    return [t for make in CLASSES.values() for t in make() if t.klass.startswith(only)]


# ----------------------------------------------------------------------------- running and judging


def _env(trial_dir: Path, tag: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "COV_"))}
    env.update(
        PYTHONPATH=str(SRC),
        MPLCONFIGDIR=str(trial_dir / ".mpl"),
        HOME=str(trial_dir / ".home"),
        COLUMNS="200",
        TERMINAL_WIDTH="200",
        NO_COLOR="1",
        PYTHONDONTWRITEBYTECODE="1",
        **{MARKER: tag},
    )
    return env


def _limits(unprivileged: bool) -> Callable[[], None]:
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
        if unprivileged and os.geteuid() == 0:
            os.setgid(UNPRIVILEGED)
            os.setuid(UNPRIVILEGED)

    return apply


def _files(root: Path) -> set[str]:
    return (
        {str(p.relative_to(root)) for p in root.rglob("*") if not p.is_dir() or p.is_symlink()}
        if root.exists()
        else set()
    )


def message_lines(stderr: str) -> list[str]:
    """The error's own lines: typer's usage framing and box drawing left out."""
    lines = [ln.translate(BOX).strip() for ln in stderr.splitlines()]
    return [ln for ln in lines if ln and not ln.startswith(("Usage:", "Try '"))]


def judge(
    rc: int,
    stdout: str,
    stderr: str,
    names: str,
    tolerate: bool = False,
    also: str = "",
    stray: Optional[set[str]] = None,
) -> tuple[bool, str]:
    """Whether a trial was handled (exit 2, no traceback, one error line naming ``names``), and why not."""
    if "Traceback (most recent call last)" in stdout + stderr:
        last = [ln for ln in (stdout + stderr).strip().splitlines() if ln.strip()][-1:]
        return False, f"traceback: {last[0].strip()[:120] if last else ''}"
    if stray:
        return False, f"wrote outside its targets: {sorted(stray)[:3]}"
    lines = message_lines(stderr)
    if tolerate and rc == 0 and names in stdout + stderr:
        return True, "warned"
    if rc != 2:
        return False, f"exit {rc}" + (f": {lines[-1][:120]}" if lines else "")
    if len(lines) != 1:
        return False, f"{len(lines)} error lines: {' / '.join(lines)[:160]}"
    if names not in lines[0]:
        return False, f"error does not name {names}: {lines[0][:160]}"
    if also and not re.search(also, lines[0]):
        return False, f"error does not match {also}: {lines[0][:160]}"
    return True, lines[0][:160]


def run_trial(trial: Trial, trial_dir: Path, python: str) -> Outcome:
    """Build the trial's files, run the CLI on them and judge the result."""
    R, O = trial_dir / "a" / "b" / "results", trial_dir / "out"
    sub = {"{T}": str(trial_dir), "{R}": str(R), "{O}": str(O)}

    def fill(s: str) -> str:
        for k, v in sub.items():
            s = s.replace(k, v)
        return s

    for rel, text in trial.files.items():
        p = trial_dir / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(fill(text).encode() if isinstance(text, str) else text)
    try:
        return _run_set_up(trial, trial_dir, python, R, fill)
    finally:
        unmount_under(trial_dir)


def _run_set_up(trial: Trial, trial_dir: Path, python: str, R: Path, fill: Callable[[str], str]) -> Outcome:
    """``run_trial`` after the trial's files are written: its setup, the run and the judgement."""
    if trial.setup:
        trial.setup(trial_dir, R)
    for scratch in (".home", ".mpl"):  # the unprivileged trials' HOME and matplotlib cache
        (trial_dir / scratch).mkdir(exist_ok=True)
        (trial_dir / scratch).chmod(0o777)
    before = _files(trial_dir)
    t0 = time.monotonic()
    try:
        proc = subprocess.run(
            [python, "-m", "specwatch.cli", *map(fill, trial.argv)],
            cwd=trial_dir,
            env=_env(trial_dir, str(trial_dir)),
            capture_output=True,
            text=True,
            errors="replace",
            timeout=TRIAL_TIMEOUT_S,
            preexec_fn=_limits(trial.unprivileged),
        )
    except subprocess.TimeoutExpired:
        return Outcome(trial.klass, trial.variant, False, f"ran past {TRIAL_TIMEOUT_S} s", time.monotonic() - t0)
    except OSError as e:  # an unprivileged trial whose interpreter that user cannot run (e.g. under /root)
        return Outcome(trial.klass, trial.variant, False, f"not run: the CLI could not start ({e})", 0.0)
    wall = time.monotonic() - t0
    allowed = (str(R.relative_to(trial_dir)), "out", ".mpl", ".home")
    stray = {f for f in _files(trial_dir) - before if not f.startswith(allowed)}
    ok, why = judge(proc.returncode, proc.stdout, proc.stderr, fill(trial.names), trial.tolerate, trial.also, stray)
    return Outcome(trial.klass, trial.variant, ok, why, wall)


# ----------------------------------------------------------------------------- fault trials

FAULT_SUITE = """[suite]
name = "hardening"
repeats = 1
timeout_s = 60
[[matrix]]
attention_backend = ["triton"]
page_size = [1, 64]
topk = [1, 2]
num_steps = [2, 3]
num_draft_tokens = [5]
batch_size = [1, 8]
"""
"""16 cases in 8 engine groups of the fake worker, none of which crash or hang."""

RUN_SCRIPT = """
import os, sys
sys.path.insert(0, {tests!r})
from specwatch.run.runner import RunOptions, run_suite
from specwatch.suite import load_suite
run_suite(load_suite({suite!r}), {results!r}, RunOptions(gpus=1, worker_module="fake_worker", resume={resume},
          extra_env={{"PYTHONPATH": {tests!r} + os.pathsep + {src!r}}}))
"""


@dataclass
class FaultOutcome:
    """One signal sent to a sweep mid-run, then the sweep resumed."""

    klass: str
    variant: str
    survived: bool
    lost: int
    duplicated: int
    orphans: int
    why: str


def _marked_pids(tag: str) -> list[int]:
    """Live processes whose environment carries ``MARKER=tag``."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if (
                f"{MARKER}={tag}".encode() in (d / "environ").read_bytes().split(b"\0")
                and (d / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
            ):
                pids.append(int(d.name))
        except OSError:
            continue
    return pids


def _records(results: Path) -> list[dict]:
    """The sweep's records: every complete line must be JSON (ValueError otherwise); a last line
    without its newline is a write in progress or one a signal tore, which the store's readers skip."""
    out = []
    for f in sorted(results.rglob("hardening.jsonl")):
        complete = f.read_bytes().rpartition(b"\n")[0]
        out += [json.loads(ln) for ln in complete.splitlines() if ln.strip()]
    return out


def _sweep(trial_dir: Path, python: str, resume: bool, tag: str) -> subprocess.Popen:
    script = RUN_SCRIPT.format(
        tests=str(TESTS),
        src=str(SRC),
        suite=str(trial_dir / "s.toml"),
        results=str(trial_dir / "results"),
        resume=resume,
    )
    env = _env(trial_dir, tag)
    env["FAKE_START_S"] = "0.3"
    return subprocess.Popen(
        [python, "-c", script],
        cwd=trial_dir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
    )


def run_fault(sig: signal.Signals, after: int, trial_dir: Path, python: str) -> FaultOutcome:
    """Send ``sig`` to the runner once ``after`` records are stored, then resume and count."""
    (trial_dir / "s.toml").write_text(FAULT_SUITE)
    tag = str(trial_dir)
    variant = f"{sig.name} after {after} records"
    proc = _sweep(trial_dir, python, False, tag)
    deadline = time.monotonic() + 60
    while len(_records(trial_dir / "results")) < after and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(sig)
    try:
        proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
    time.sleep(2)
    orphans = _marked_pids(tag)
    for pid in orphans:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        _records(trial_dir / "results")
    except ValueError as e:
        return FaultOutcome("fault: signal mid-sweep", variant, False, -1, -1, len(orphans), f"store unreadable: {e}")
    resumed = _sweep(trial_dir, python, True, tag + "-resume")
    out, _ = resumed.communicate(timeout=120)
    recs = _records(trial_dir / "results")
    ok: dict[str, int] = {}
    for r in recs:
        if r.get("status") == "ok":
            ok[r["case_id"]] = ok.get(r["case_id"], 0) + 1
    lost = 16 - len(ok)
    dup = sum(n - 1 for n in ok.values())
    why = "resumed" if resumed.returncode == 0 else f"resume exit {resumed.returncode}: {out.strip()[-160:]}"
    return FaultOutcome(
        "fault: signal mid-sweep",
        variant,
        resumed.returncode == 0 and not lost and not dup and not orphans,
        lost,
        dup,
        len(orphans),
        why,
    )


FAULTS: tuple[tuple[signal.Signals, int], ...] = tuple(
    (s, n) for s in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT) for n in (1, 6)
)


# ----------------------------------------------------------------------------- report


def run_all(
    only: str = "", jobs: int = 0, python: str = sys.executable, faults: bool = True
) -> tuple[list[Outcome], list[FaultOutcome]]:
    """Run every selected trial (and the fault trials) in parallel; outcomes in trial order."""
    trials = all_trials(only)
    do_faults = faults and ("fault:".startswith(only) or only.startswith("fault:"))
    base = Path(tempfile.mkdtemp(prefix="hd-"))
    base.chmod(0o755)
    try:
        # fault trials mostly wait on their sweeps: threads of their own, beside the CPU-bound trials
        with (
            ThreadPoolExecutor(max_workers=len(FAULTS)) as waits,
            ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 2) as pool,
        ):
            fault_futs = (
                [waits.submit(run_fault, s, n, _mk(base, f"f{i}"), python) for i, (s, n) in enumerate(FAULTS)]
                if do_faults
                else []
            )
            futs = [pool.submit(run_trial, t, _mk(base, f"{i:03d}"), python) for i, t in enumerate(trials)]
            return [f.result() for f in futs], [f.result() for f in fault_futs]
    finally:
        subprocess.run(["chmod", "-R", "u+w", str(base)], check=False)
        shutil.rmtree(base, ignore_errors=True)


def _mk(base: Path, name: str) -> Path:
    d = base / name
    d.mkdir()
    return d


def print_report(outcomes: list[Outcome], faults: list[FaultOutcome], failures: bool) -> None:
    """The table the maintainers read: per class, tried and handled; then the fault trials."""
    from rich.console import Console
    from rich.table import Table

    console = Console(width=200)
    t = Table(title="bad inputs: handled = one clear error line naming the file/option, exit 2, no traceback")
    for col in ("class of input", "tried", "handled", "not handled", "first not handled (why)"):
        t.add_column(col, overflow="fold")
    for klass in sorted({o.klass for o in outcomes}):
        mine = [o for o in outcomes if o.klass == klass]
        bad = [o for o in mine if not o.handled]
        t.add_row(
            klass,
            str(len(mine)),
            str(len(mine) - len(bad)),
            str(len(bad)),
            f"{bad[0].variant}: {bad[0].why}" if bad else "",
        )
    handled = sum(o.handled for o in outcomes)
    t.add_row("all", str(len(outcomes)), str(handled), str(len(outcomes) - handled), "", style="bold")
    console.print(t)
    if faults:
        f = Table(title="faults: a signal to the runner mid-sweep, then --resume (fake worker, 16 cases)")
        for col in ("fault", "tried", "survived", "records lost", "duplicated", "orphans", "note"):
            f.add_column(col, overflow="fold")
        for o in faults:
            f.add_row(
                o.variant, "1", "yes" if o.survived else "no", str(o.lost), str(o.duplicated), str(o.orphans), o.why
            )
        console.print(f)
    if failures:
        for o in outcomes:
            if not o.handled:
                console.print(f"not handled: [{o.klass}] {o.variant}: {o.why}", markup=False, highlight=False)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="", help="Only classes whose name starts with this (e.g. 'suite:').")
    ap.add_argument("--jobs", type=int, default=0, help="Trials at once (default: one per core).")
    ap.add_argument("--no-faults", action="store_true", help="Skip the signal trials.")
    ap.add_argument("--failures", action="store_true", help="List every trial not handled.")
    ap.add_argument("--json", type=Path, help="Also write every outcome as JSON here.")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    outcomes, faults = run_all(args.only, args.jobs, faults=not args.no_faults)
    print_report(outcomes, faults, args.failures)
    print(f"{len(outcomes)} input trials, {len(faults)} fault trials in {time.monotonic() - t0:.0f} s")
    if args.json:
        args.json.write_text(
            json.dumps({"inputs": [o.__dict__ for o in outcomes], "faults": [o.__dict__ for o in faults]}, indent=1)
            + "\n"
        )
    return 0 if all(o.handled for o in outcomes) and all(o.survived for o in faults) else 1


if __name__ == "__main__":
    sys.exit(main())
