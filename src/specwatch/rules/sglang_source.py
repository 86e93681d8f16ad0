"""SGLang's own functions and classes, executed from their source files one definition at a time.

Importing ``sglang.srt`` loads about 5,200 modules (torch, transformers, the serving stack) and
takes seconds; the sizing functions the CPU tier compares against are a few dozen lines that read
a configuration. ``SourceTree`` parses a module's file and executes only the top-level
definitions asked for, plus (transitively) the module-level names they need, in a namespace of
its own: nothing enters ``sys.modules``, so several releases' trees live side by side in one
process and beside an installed SGLang.

Rules (each the way Python itself binds names, made lazy):

* a top-level ``def``/``class``/assignment is executed when its name is first needed; names its
  decorators, bases, defaults and class body use are resolved first;
* names used only inside function bodies are bound to a ``_Deferred`` stand-in that resolves the
  real object on first call or attribute access and then replaces itself in the namespace;
* ``from sglang... import x`` (module level or inside a function) reads ``x`` from that module's
  file the same way; other imports are real imports, made only when the name is touched;
* ``overrides`` replace names of a module (the runtime-context readers of 0.5.18+, ``torch`` for a
  shape-only pool) before anything else binds them.

Each definition is compiled with its file's name and line numbers, so tracebacks and
``inspect`` point at SGLang's lines.
"""

from __future__ import annotations
import __future__

import ast
import builtins
import importlib
from pathlib import Path
from typing import Any, Optional

from specwatch.core.errors import SpecwatchInputError

_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


class _Deferred:
    """A module-level name a function body uses, resolved when first touched."""

    def __init__(self, tree: "SourceTree", module: str, name: str):
        self._where = (tree, module, name)

    def _real(self):
        tree, module, name = self._where
        return tree.get(module, name)

    def __call__(self, *a, **k):
        return self._real()(*a, **k)

    def __getattr__(self, attr):
        return getattr(self._real(), attr)

    def __contains__(self, item):
        return item in self._real()

    def __iter__(self):
        return iter(self._real())


class _LocalImports(ast.NodeTransformer):
    """``from sglang.x import a as b`` inside a function -> ``b = __specwatch_from__('sglang.x', 'a')``."""

    def __init__(self, package: str):
        self.package = package

    def visit_ImportFrom(self, node: ast.ImportFrom):
        mod = _absolute(node, self.package)
        if not mod.startswith("sglang") or any(a.name == "*" for a in node.names):
            return node
        out = [
            ast.Assign(
                targets=[ast.Name(a.asname or a.name, ast.Store())],
                value=ast.Call(
                    ast.Name("__specwatch_from__", ast.Load()), [ast.Constant(mod), ast.Constant(a.name)], []
                ),
            )
            for a in node.names
        ]
        for n in out:
            ast.copy_location(n, node)
            ast.fix_missing_locations(n)
        return out


def _absolute(node: ast.ImportFrom, package: str) -> str:
    if not node.level:
        return node.module or ""
    base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
    return f"{base}.{node.module}" if node.module else base


class _Module:
    """One parsed file: its top-level bindings and the namespace its definitions run in."""

    def __init__(self, tree: "SourceTree", name: str, path: Path):
        self.name, self.path = name, path
        text = path.read_text()
        self.ast = ast.parse(text, str(path))
        self.flags = __future__.annotations.compiler_flag if "from __future__ import annotations" in text else 0
        self.package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        self.bindings: dict[str, ast.stmt] = {}
        for node in self.ast.body:
            for n in _bound_names(node):
                self.bindings.setdefault(n, node)
        self.ns: dict[str, Any] = {
            "__name__": f"specwatch_source.{name}",
            "__file__": str(path),
            "__builtins__": builtins,
            "__specwatch_from__": tree.get,
        }
        self.done: set[int] = set()


def _bound_names(node: ast.stmt) -> list[str]:
    if isinstance(node, _DEFS):
        return [node.name]
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return [(a.asname or a.name).split(".")[0] for a in node.names if a.name != "*"]
    if isinstance(node, (ast.Assign, ast.AnnAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
    if isinstance(node, ast.Try):
        return [n for stmt in node.body + [s for h in node.handlers for s in h.body] for n in _bound_names(stmt)]
    return []


def _names(nodes) -> set[str]:
    return {n.id for node in nodes if node is not None for n in ast.walk(node) if isinstance(n, ast.Name)}


def _eager_and_lazy(node: ast.stmt) -> tuple[set[str], set[str]]:
    """Names needed when the statement runs, and names only its function bodies use."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        a = node.args
        eager = _names(node.decorator_list + a.defaults + [d for d in a.kw_defaults if d is not None])
        return eager, _names(node.body)
    if isinstance(node, ast.ClassDef):
        eager = _names(node.decorator_list + node.bases + [k.value for k in node.keywords])
        lazy: set[str] = set()
        for stmt in node.body:
            e, lz = _eager_and_lazy(stmt) if isinstance(stmt, _DEFS) else (_names([stmt]), set())
            eager |= e
            lazy |= lz
        return eager, lazy
    return _names([node]), set()


class SourceTree:
    """SGLang's source under ``root`` (the folder holding ``sglang/``), read definition by definition."""

    def __init__(self, root: Path, overrides: Optional[dict[str, dict[str, Any]]] = None):
        self.root = Path(root)
        if not (self.root / "sglang").is_dir():
            raise SpecwatchInputError(self.root, "no sglang/ package here", field="SGLang source root")
        self.overrides = overrides or {}
        self._modules: dict[str, _Module] = {}

    def _module(self, name: str) -> _Module:
        if name not in self._modules:
            base = self.root.joinpath(*name.split("."))
            path = base.with_suffix(".py") if base.with_suffix(".py").exists() else base / "__init__.py"
            if not path.exists():
                raise ModuleNotFoundError(f"{name} is not in {self.root}", name=name)
            mod = _Module(self, name, path)
            mod.ns.update(self.overrides.get(name, {}))
            self._modules[name] = mod
        return self._modules[name]

    def get(self, module: str, name: str) -> Any:
        """The object ``module.name`` as SGLang's file defines it."""
        mod = self._module(module)
        if name in mod.ns and not isinstance(mod.ns[name], _Deferred):
            return mod.ns[name]
        node = mod.bindings.get(name)
        if node is None:
            raise AttributeError(f"{module} ({mod.path}) binds no top-level {name!r}")
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            self._bind_import(mod, node, name)
        else:
            self._run(mod, node)
        if name not in mod.ns or isinstance(mod.ns[name], _Deferred):
            raise AttributeError(f"{module}.{name}: {type(node).__name__} at line {node.lineno} did not bind it")
        return mod.ns[name]

    def _run(self, mod: _Module, node: ast.stmt) -> None:
        if id(node) in mod.done:
            return
        mod.done.add(id(node))
        eager, lazy = _eager_and_lazy(node)
        own = set(_bound_names(node))
        for n in sorted(eager - own):
            if n in mod.bindings and (n not in mod.ns or isinstance(mod.ns[n], _Deferred)):
                self.get(mod.name, n)
        for n in lazy - own:
            if n in mod.bindings and n not in mod.ns:
                mod.ns[n] = _Deferred(self, mod.name, n)
        if isinstance(node, _DEFS):
            node = _LocalImports(mod.package).visit(node)
            ast.fix_missing_locations(node)
        code = compile(ast.Module([node], []), str(mod.path), "exec", flags=mod.flags, dont_inherit=True)
        exec(code, mod.ns)

    def _bind_import(self, mod: _Module, node: ast.stmt, wanted: str) -> None:
        """Bind ``wanted`` from the import statement that names it (only that name)."""
        if isinstance(node, ast.Import):
            for a in node.names:
                if (a.asname or a.name.split(".")[0]) == wanted:
                    m = importlib.import_module(a.name)
                    mod.ns[wanted] = m if a.asname else importlib.import_module(a.name.split(".")[0])
            return
        src = _absolute(node, mod.package)
        for a in node.names:
            if (a.asname or a.name) != wanted:
                continue
            if src.startswith("sglang"):
                mod.ns[wanted] = self.get(src, a.name)
            else:
                mod.ns[wanted] = getattr(importlib.import_module(src), a.name)
