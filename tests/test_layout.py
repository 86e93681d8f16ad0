"""The package's import structure: packages by floor, no cycle, no upward import, nobody imports the worker."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "src" / "specwatch"

FLOORS = {
    "core": 1,
    "oracle": 2,
    "inject": 2,
    "own": 2,
    "rules": 3,
    "store": 4,
    "worker": 4,
    "suite": 4,
    "kit": 4,
    "run": 5,
    "cpu": 5,
    "analysis": 5,
    "present": 6,
    "commands": 7,
    "cli": 8,
}
"""Each top-level package or module of ``specwatch`` and its floor: a module imports only modules of
its own package or of a lower floor."""


def module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> set[str]:
    """The ``specwatch`` modules ``path`` imports (at module level or inside functions)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and node.module.startswith("specwatch"):
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                out.add(
                    candidate
                    if (PKG.parent / (candidate.replace(".", "/") + ".py")).exists()
                    or (PKG.parent / candidate.replace(".", "/")).is_dir()
                    else node.module
                )
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("specwatch")}
    return out


def graph() -> dict[str, set[str]]:
    return {module_name(p): imports_of(p) for p in PKG.rglob("*.py") if "_stubs" not in p.parts}


def top(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_every_top_level_part_has_a_floor():
    tops = {top(m) for m in graph()} - {""}
    assert tops <= set(FLOORS), f"give these a floor in FLOORS: {sorted(tops - set(FLOORS))}"


def test_imports_run_down_the_floors_only():
    upward = []
    for mod, deps in graph().items():
        here = top(mod)
        for dep in deps:
            there = top(dep)
            if not here or not there or here == there:
                continue
            if FLOORS[there] >= FLOORS[here]:
                upward.append(f"{mod} -> {dep} (floor {FLOORS[here]} -> {FLOORS[there]})")
    assert not upward, "imports that do not run down the floors:\n" + "\n".join(sorted(upward))


def test_no_import_cycle():
    g = graph()
    state: dict[str, int] = {}
    cycles = []

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        for d in sorted(g.get(m, ())):
            if d not in g:
                continue
            if state.get(d) == 1:
                cycles.append(" -> ".join(stack[stack.index(d) :] + [d]) if d in stack else f"{m} -> {d}")
            elif d not in state:
                visit(d, stack + [d])
        state[m] = 2

    for m in sorted(g):
        if m not in state:
            visit(m, [m])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_nobody_imports_the_worker():
    """The worker is a child process (``python -m specwatch.worker``), not a library."""
    importers = sorted(m for m, deps in graph().items() if top(m) != "worker" and any(top(d) == "worker" for d in deps))
    assert not importers, f"modules importing specwatch.worker: {importers}"


MAX_MODULE_LINES = 400
"""A module stays under this many lines."""

MAX_FUNCTION_LINES = 60
"""A function or method longer than this (``end_lineno - lineno + 1``) says why in its docstring,
in a sentence that starts ``Long because``."""

PENDING: set[str] = set()
"""Modules (path under ``src/specwatch``) and functions (``path::qualname``) still being split, skipped
by the two size tests below; an entry that passes fails ``test_pending_lists_only_what_still_fails``."""


def sources() -> list[Path]:
    return sorted(p for p in PKG.rglob("*.py") if "_stubs" not in p.parts)


def rel(path: Path) -> str:
    return path.relative_to(PKG).as_posix()


def long_modules() -> dict[str, int]:
    """Modules of ``MAX_MODULE_LINES`` lines or more, with their line counts."""
    lines = {rel(p): len(p.read_text().splitlines()) for p in sources()}
    return {m: n for m, n in lines.items() if n >= MAX_MODULE_LINES}


def long_functions() -> dict[str, int]:
    """``path::qualname`` of every function over ``MAX_FUNCTION_LINES`` lines without a ``Long
    because`` reason in its docstring, with its length."""
    out = {}

    def visit(node: ast.AST, path: str, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = child.end_lineno - child.lineno + 1
                if length > MAX_FUNCTION_LINES and "Long because" not in (ast.get_docstring(child) or ""):
                    out[f"{path}::{prefix}{child.name}"] = length
                visit(child, path, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, path, f"{prefix}{child.name}.")
            else:
                visit(child, path, prefix)

    for p in sources():
        visit(ast.parse(p.read_text()), rel(p), "")
    return out


def test_every_module_is_under_400_lines():
    over = {m: n for m, n in long_modules().items() if m not in PENDING}
    assert not over, "modules to split below 400 lines: " + ", ".join(f"{m} ({n})" for m, n in sorted(over.items()))


def test_every_function_over_60_lines_says_why():
    over = {f: n for f, n in long_functions().items() if f not in PENDING}
    assert not over, "functions over 60 lines without 'Long because' in their docstring: " + ", ".join(
        f"{f} ({n})" for f, n in sorted(over.items())
    )


def test_pending_lists_only_what_still_fails():
    """``PENDING`` shrinks as the splits land: an entry that now passes is struck from it."""
    stale = PENDING - set(long_modules()) - set(long_functions())
    assert not stale, f"PENDING entries that pass now (strike them): {sorted(stale)}"
