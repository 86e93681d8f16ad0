"""Release adapters (specwatch.rules.releases) checked against each release's own Python.

The per-release tests import the unpacked release (``scripts/fetch_sglang_sources.sh`` fills the
cache) in a process each (forked from one server per test process that has the release-independent
packages imported, ``serve``), with that release first on ``sys.path`` and SGLang's package
``__init__`` skipped (it imports the serving stack), and check every name, signature and match
text the release's adapter gives; the faults' edits are applied with the release's own source
patcher and restored. Without the cache they skip, saying how to fill it (they fail instead with
``SPECWATCH_REQUIRE_SGLANG_SRC=1``; ``SPECWATCH_SGLANG_SRC`` names another cache folder).

Run as a script (``python tests/test_releases.py ROOT VERSION ARGS_JSON``) it checks one release and
prints the failed checks as JSON; ``python tests/test_releases.py --serve`` is the fork server.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from specwatch.rules.releases import (
    ADAPTERS,
    FaultSite,
    ReleaseAdapter,
    UnknownReleaseError,
    WatermarkSite,
    adapter_for,
    releases,
)

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
CACHE = Path(os.environ.get("SPECWATCH_SGLANG_SRC", ROOT / ".cache" / "sglang-src"))


# ---------------------------------------------------------------- the subprocess (one release)


def _stub_sglang_package(root: str) -> None:
    """``sglang`` as a bare package rooted at the unpacked release: submodules import from there,
    the package ``__init__`` (engine, serving stack) never runs."""
    import types

    pkg = types.ModuleType("sglang")
    pkg.__path__ = [os.path.join(root, "sglang")]
    pkg.__file__ = os.path.join(root, "sglang", "__init__.py")
    sys.modules["sglang"] = pkg


def _stub_process_title() -> None:
    """``setproctitle`` (a C extension the scheduler and the 0.5.13-0.5.15 EAGLE worker import at
    module level) as a no-op where it is not installed: the checks never start a process."""
    import importlib.util
    import types

    if importlib.util.find_spec("setproctitle") is None:
        mod = types.ModuleType("setproctitle")
        mod.setproctitle = mod.getproctitle = lambda *a, **k: ""
        sys.modules["setproctitle"] = mod


def _resolve(dotted: str):
    """The object at ``dotted`` (longest importable module prefix, then attributes; a property
    or a classmethod as declared)."""
    import importlib
    import inspect

    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        name = ".".join(parts[:i])
        try:
            obj = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name and name.startswith(e.name) or e.name == name:
                continue
            raise
        for attr in parts[i:]:
            obj = inspect.getattr_static(obj, attr) if isinstance(obj, type) else getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(dotted)


def _occurrences(source: str, match: str) -> int:
    """How often ``match``'s lines occur in ``source`` compared stripped (the source patcher's rule)."""
    src = [line.strip() for line in source.splitlines()]
    m = [line.strip() for line in match.strip().splitlines()]
    return sum(src[i : i + len(m)] == m for i in range(len(src) - len(m) + 1))


class NeedsServingStack(Exception):
    """The module imports a third-party package the CPU venv lacks (the serving stack)."""


def _function_source(dotted: str, root: str | None = None) -> str:
    """The source of the function at ``dotted``. With ``root``, a module that cannot be imported
    for want of a third-party package is read from its file instead (the function's text by AST)."""
    import inspect

    try:
        obj = _resolve(dotted)
    except ModuleNotFoundError as e:
        if root is None or (e.name or "").startswith("sglang"):
            raise
        return _static_source(root, dotted, e.name)
    return inspect.getsource(obj.fget if isinstance(obj, property) else obj)


def _static_source(root: str, dotted: str, missing: str) -> str:
    parts = dotted.split(".")
    for i in range(len(parts) - 1, 0, -1):
        path = Path(root, *parts[:i]).with_suffix(".py")
        if path.exists():
            break
    else:
        raise ModuleNotFoundError(dotted)
    text = path.read_text()
    node: ast.AST = ast.parse(text)
    for name in parts[i:]:
        node = next(
            n
            for n in ast.iter_child_nodes(node)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == name
        )
    raise NeedsServingStack(missing, ast.get_source_segment(text, node))


def check_release(root: str, version: str, specwatch_args: list[str]) -> list[str]:
    """Every check of the release's adapter against the release at ``root``; the failures."""
    import warnings

    warnings.simplefilter("ignore")
    os.environ.setdefault("SGLANG_DISABLE_REQUEST_LOGGING", "1")
    sys.path.insert(0, root)
    _stub_sglang_package(root)
    _stub_process_title()
    from specwatch.core.sglang_host import ensure_import_stubs

    ensure_import_stubs()
    a = adapter_for(version)
    failures: list[str] = []
    srt = Path(root) / "sglang" / "srt"

    def check(what: str, fn) -> None:
        try:
            ok = fn()
        except Exception as e:  # a name that does not resolve is a failed check, reported as such
            failures.append(f"{what}: {type(e).__name__}: {e}")
            return
        if ok is not True:
            failures.append(f"{what}: {ok}")

    for cls in (_sizing_checks, _pool_checks, _watermark_checks, _server_arg_checks, _probe_checks, _fault_checks):
        for what, fn in cls(a, srt, root, specwatch_args):
            check(what, fn)
    return failures


def _params(dotted: str) -> list[str]:
    import inspect

    return list(inspect.signature(_resolve(dotted)).parameters)


def _absent(module: str, name: str):
    def fn():
        try:
            mod = _resolve(module)
        except ModuleNotFoundError:
            return True
        return True if not hasattr(mod, name) else f"{module}.{name} exists"

    return fn


def _sizing_checks(a, srt, root, _args):
    from specwatch.rules.releases import SizingArgs  # noqa: PLC0415 (one release per process)

    takes_args = a.sizing_args is SizingArgs.server_args
    want = lambda p: (len(p) >= 1) == takes_args or f"parameters {p} for {a.sizing_args.value}"
    yield "alloc_len_fn", lambda: want(_params(a.alloc_len_fn))
    for field, name in (
        ("alloc_reserve_fn", "get_alloc_reserve_per_decode"),
        ("extra_context_len_fn", "get_req_to_token_extra_context_len"),
        ("alloc_page_size_fn", "get_alloc_page_size"),
    ):
        dotted = getattr(a, field)
        if dotted is None:
            yield f"{field} is None", _absent(a.sizing_module, name)
        elif field == "alloc_page_size_fn":
            yield field, lambda d=dotted: _params(d) == [] or "takes parameters"
        else:
            yield field, lambda d=dotted: want(_params(d))
    if a.reserved_tokens_fn is None:
        yield "reserved_tokens_fn is None", _absent("sglang.srt.managers.utils", "compute_num_reserved_tokens")
    else:
        yield "reserved_tokens_fn", lambda: want(_params(a.reserved_tokens_fn))
    path, func = a.row_sizing_site.split(":")
    yield "row_sizing_site", lambda: f"def {func.rsplit('.', 1)[-1]}(" in (srt / path).read_text() or "no such def"
    meta = next(Path(root).glob("*.dist-info/METADATA")).read_text()
    yield "torch_pin", lambda: f"Requires-Dist: torch=={a.torch_pin}\n" in meta or "another torch pin"


def _pool_checks(a, srt, _root, _args):
    yield (
        "req_to_token_pool_class",
        lambda: (
            _params(a.req_to_token_pool_class + ".__init__")[1:]
            == ["size", "max_context_len", "device", "enable_memory_saver"]
            or "other constructor parameters"
        ),
    )
    yield (
        "paged_allocator_module",
        lambda: all(
            hasattr(_resolve(a.paged_allocator_module), n)
            for n in ("PagedTokenToKVPoolAllocator", "alloc_extend_naive")
        ),
    )
    yield "token_allocator_class", lambda: isinstance(_resolve(a.token_allocator_class), type)
    yield "num_new_pages_fn", lambda: "page_size" in _params(a.num_new_pages_fn)
    if a.kv_cache_configurator_class is None:
        yield (
            "kv_cache_configurator_class is None",
            lambda: not (srt / "mem_cache" / "kv_cache_configurator.py").exists() or "kv_cache_configurator.py exists",
        )
    else:

        def page_property():
            cls = _resolve(a.kv_cache_configurator_class)
            is_prop = isinstance(cls.__dict__.get("pool_page_size"), property)
            if is_prop != a.draft_pool_page_size_property:
                return f"pool_page_size property: {is_prop}"
            return not is_prop or hasattr(_resolve(cls.__module__), "get_schedule") or "no get_schedule"

        yield "draft_pool_page_size_property", page_property


def _watermark_checks(a, _srt, _root, _args):
    from specwatch.rules.releases import WatermarkSite

    def shape():
        src = _function_source(a.watermark_function)
        rounds = "// page_size" in src
        if a.watermark is WatermarkSite.inline_unaligned:
            return (not rounds and "nxt = max(cur, r.kv_committed_len + double_alloc)" in src) or "not unaligned"
        return rounds or "no round-up to a page"

    yield "watermark", shape
    for caller in a.watermark_callers:
        name = a.watermark_function.rsplit(".", 1)[-1]
        yield (
            f"watermark caller {caller}",
            lambda c=caller, n=name: (
                c == a.watermark_function or f"{n}(" in _function_source(c) or f"does not call {n}"
            ),
        )


def _server_arg_checks(a, srt, root, specwatch_args):
    import dataclasses
    import inspect

    from specwatch.rules.releases import ServerArgsFields

    def fields() -> set[str]:
        cls = _resolve("sglang.srt.server_args.ServerArgs")
        if a.server_args_fields is ServerArgsFields.dataclass:
            return {f.name for f in dataclasses.fields(cls)}
        try:
            dataclasses.fields(cls)
        except TypeError:
            return set(inspect.signature(cls).parameters)
        raise AssertionError("ServerArgs is a dataclass")

    def args():
        names = fields()
        wrong = []
        for arg in specwatch_args:
            if arg in a.renamed_args:
                ok = a.renamed_args[arg] in names and arg not in names
            elif arg in a.absent_args:
                ok = arg not in names
            else:
                ok = arg in names
            if not ok:
                wrong.append(arg)
        return not wrong or f"not as the adapter says: {wrong}"

    yield "server args", args
    for f in a.arg_validation_files:
        yield f"arg_validation_files {f}", lambda f=f: (Path(root) / "sglang" / f).exists() or "missing"

    def tree_backends():
        if a.page_tree_spec_backends_site is None:
            text = (srt / "server_args.py").read_text()
            return "_PAGE_TREE_SPEC_BACKENDS" not in text or "the list exists"
        path, func = a.page_tree_spec_backends_site.removeprefix("srt/").split(":")
        tree = ast.parse((srt / path).read_text())
        fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == func)
        return "_PAGE_TREE_SPEC_BACKENDS" in ast.unparse(fn) or f"not in {func}"

    yield "page_tree_spec_backends_site", tree_backends


def _probe_checks(a, srt, _root, _args):
    tm = (srt / "managers" / "tokenizer_manager.py").read_text()
    yield "correct_drafts_histogram_key", lambda: f'meta_info["{a.correct_drafts_histogram_key}"]' in tm or "not sent"
    if a.accept_histogram_key is None:
        yield "accept_histogram_key is None", lambda: '"spec_accept_histogram"' not in tm or "still sent"
    else:
        yield "accept_histogram_key", lambda: f'meta_info["{a.accept_histogram_key}"]' in tm or "not sent"
    managers = "\n".join(p.read_text() for p in (srt / "managers").rglob("*.py"))
    checker = srt / "managers" / "scheduler_components" / "invariant_checker.py"
    on_checker = checker.exists() and "count_memory_leak_warnings" in checker.read_text()
    yield (
        "leak_counters_on",
        lambda: (
            (
                a.leak_counters_on == ("invariant_checker" if on_checker else "scheduler")
                and "count_memory_leak_warnings" in managers
            )
            or "elsewhere"
        ),
    )
    has_startup = "self.startup_time" in managers and "scheduler_startup_begin" in managers
    yield "scheduler_startup_time", lambda: has_startup == a.scheduler_startup_time or f"found: {has_startup}"


NOTES: list[str] = []
"""What the subprocess could not check (a module needing a package the CPU venv lacks)."""


def _fault_checks(a, _srt, root, _args):
    import importlib

    from specwatch.inject.faults import FAULTS, hit_expression

    edits = {n for n, f in FAULTS.items() if f.edits_source}
    yield (
        "faults cover the source-patcher faults",
        lambda: (
            set(a.faults) | set(a.faults_absent) == edits
            and not set(a.faults) & set(a.faults_absent)
            or f"faults {sorted(a.faults)}, absent {sorted(a.faults_absent)}"
        ),
    )
    sites = [(n, site) for n, site in a.faults.items()] + [
        (f"{n} (DFLASH)", site) for n, site in a.dflash_faults.items()
    ]
    yield "DFLASH edits are of faults with an EAGLE edit", lambda: set(a.dflash_faults) <= set(a.faults) or "no"
    for name, site in sites:
        yield f"fault {name}: target in module", lambda s=site: s.target.startswith(s.module + ".") or "no"

        def matches(s=site):
            try:
                src = _function_source(s.target, root)
            except NeedsServingStack as e:
                NOTES.append(
                    f"{s.target}: module needs {e.args[0]} (not installed): match text checked "
                    f"in its file, the source patcher not run"
                )
                src = e.args[1]
            return _occurrences(src, s.match) == 1 or "not exactly once"

        yield f"fault {name}: match text", matches

        def applies(s=site, n=name):
            try:
                importlib.import_module(s.module)
            except ModuleNotFoundError as e:
                if (e.name or "").startswith("sglang"):
                    raise
                return True  # noted by the match-text check
            from sglang.srt.debug_utils.source_patcher import apply_patches_from_config

            states = apply_patches_from_config(s.patch_yaml(hit_expression(n.split(" ")[0])))
            for st in reversed(states):
                st.restore()
            return True

        yield f"fault {name}: the release's source patcher applies it", applies


def main(argv: list[str]) -> None:
    if argv[1:] == ["--serve"]:
        serve()
        return
    root, version, args = argv[1], argv[2], json.loads(argv[3])
    failures = check_release(root, version, args)
    sys.stdout.write("\n" + json.dumps({"failures": failures, "notes": NOTES}) + "\n")


WARM_IMPORTS = (
    "torch",
    "torch._dynamo",
    "torch._inductor.lowering",
    "transformers",
    "transformers.models",
    "transformers.processing_utils",
    "openai",
    "aiohttp",
    "compressed_tensors",
    "xgrammar",
)
"""Third-party modules the releases' checked modules import, from the venv whichever the release (about
half of a release's import time): ``serve`` imports those installed once (after the import stubs, as
``check_release`` puts them) and forks a child per release."""


def serve() -> None:
    """The per-release checks as a fork server: one JSON request a line on stdin (``root``,
    ``version``, ``args``, ``result``: where the child writes its failures and notes as JSON, ``log``:
    its stdout and stderr), each checked in a child forked from this process, which has
    ``WARM_IMPORTS`` imported but no SGLang module; one line ``{"rc": exit code}`` on stdout per request.
    The child puts its release first on ``sys.path`` as the one-release subprocess does, so a
    release's modules never meet another's."""
    import importlib
    import traceback

    from specwatch.core.sglang_host import ensure_import_stubs

    warnings.simplefilter("ignore")
    ensure_import_stubs()
    for name in WARM_IMPORTS:
        try:
            importlib.import_module(name)
        except ImportError:  # a child that needs it fails as the one-release subprocess would
            pass
    assert not any(m == "sglang" or m.startswith("sglang.") for m in sys.modules)
    for line in sys.stdin:
        req = json.loads(line)
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                fd = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
                os.dup2(fd, 1)
                os.dup2(fd, 2)
                os.chdir(req["root"])
                failures = check_release(req["root"], req["version"], req["args"])
                Path(req["result"]).write_text(json.dumps({"failures": failures, "notes": NOTES}))
                code = 0
            except BaseException:  # noqa: BLE001 (the test reports it from the log)
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        sys.stdout.write(json.dumps({"rc": os.waitstatus_to_exitcode(status)}) + "\n")
        sys.stdout.flush()


# ---------------------------------------------------------------- the tests


def specwatch_engine_args() -> list[str]:
    """Every engine argument ``worker.engine_args.engine_kwargs`` can pass, read from its source
    (the ``dict(...)`` keywords and ``kw["..."]`` keys), plus the older names it renames to."""
    tree = ast.parse((SRC / "specwatch" / "worker" / "engine_args.py").read_text())
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "engine_kwargs")
    names = {
        k.arg
        for n in ast.walk(fn)
        if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "dict"
        for k in n.keywords
    }
    names |= {
        n.slice.value
        for n in ast.walk(fn)
        if isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Constant) and getattr(n.value, "id", "") == "kw"
    }
    return sorted(names | {"nccl_port"})


def test_engine_args_read_from_the_worker_source():
    args = specwatch_engine_args()
    assert {"speculative_eagle_topk", "dcp_size", "cuda_graph_max_bs_decode", "chunked_prefill_size"} <= set(args)


def test_every_known_release_maps_to_the_range_holding_it():
    for v in releases():
        a = adapter_for(v)
        lo, hi = (tuple(map(int, x.split("."))) for x in (a.first, a.last))
        assert lo <= tuple(map(int, v.split("."))) <= hi


def test_ranges_are_ordered_contiguous_and_disjoint():
    vs = releases()
    assert vs == [f"0.5.{x}" for x in range(12, 24)]
    assert len(vs) == len(set(vs))
    assert [adapter_for(v) for v in vs] == [
        a for a in ADAPTERS for _ in range(int(a.first.split(".")[-1]), int(a.last.split(".")[-1]) + 1)
    ]


@pytest.mark.parametrize(
    "version,release",
    [("0.5.17.post1", "0.5.17"), ("0.5.19rc2", "0.5.19"), ("0.5.17+g0123456789ab", "0.5.17"), ("0.5.23", "0.5.23")],
)
def test_suffixed_versions_read_as_their_release(version, release):
    assert adapter_for(version) is adapter_for(release)


@pytest.mark.parametrize("version", ["0.5.11", "0.5.24", "0.6.0", "0.4.9.post2"])
def test_a_version_outside_every_range_is_refused_naming_it(version):
    with pytest.raises(UnknownReleaseError) as e:
        adapter_for(version)
    assert version in str(e.value) and "\n" not in str(e.value)
    assert "0.5.12 to 0.5.23" in str(e.value)


def test_a_string_that_is_no_version_is_refused_in_one_line():
    with pytest.raises(UnknownReleaseError, match="'latest' is no PEP 440 version"):
        adapter_for("latest")


@pytest.mark.parametrize("model", ["ReleaseAdapter", "FaultSite"])
def test_every_adapter_field_is_documented(model):
    cls = {"ReleaseAdapter": ReleaseAdapter, "FaultSite": FaultSite}[model]
    undocumented = [n for n, f in cls.model_fields.items() if not (f.description or "").strip()]
    assert not undocumented


def test_adapters_are_frozen():
    with pytest.raises(Exception):
        ADAPTERS[0].torch_pin = "0"


def test_fault_replacements_carry_the_hit_counter():
    for a in ADAPTERS:
        for name, site in [*a.faults.items(), *a.dflash_faults.items()]:
            assert "{hit}" in site.replacement, (a.first, name)


def test_watermark_helper_from_0_5_19_on_and_acceptance_histogram_key_gone_from_0_5_21():
    assert adapter_for("0.5.18").watermark is WatermarkSite.inline_aligned
    assert adapter_for("0.5.19").watermark is WatermarkSite.page_aligned_helper
    assert adapter_for("0.5.20").accept_histogram_key == "spec_accept_histogram"
    assert adapter_for("0.5.21").accept_histogram_key is None


def _cached(version: str) -> Path | None:
    d = CACHE / version
    return d if (d / ".complete").exists() else None


@pytest.fixture(scope="module")
def release_checks(tmp_path_factory):
    """``check(root, version)``: the release's checks in a child of one fork server (``serve``) per
    test process, so the packages every release imports are imported once, not once per release;
    the child's exit code, its JSON result (None where it failed) and its log."""
    import select

    d = tmp_path_factory.mktemp("release-checks")
    env = {**os.environ, "PYTHONPATH": str(SRC), "PYTHONWARNINGS": "ignore"}
    err = open(d / "server.log", "w")  # noqa: SIM115 (closed at teardown)
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=err,
        text=True,
        env=env,
        cwd=str(ROOT),
    )
    args = specwatch_engine_args()

    def check(root: Path, version: str) -> tuple[int, dict | None, str]:
        result, log = d / f"{version}.json", d / f"{version}.log"
        req = {"root": str(root), "version": version, "args": args, "result": str(result), "log": str(log)}
        server.stdin.write(json.dumps(req) + "\n")
        server.stdin.flush()
        ready, _, _ = select.select([server.stdout], [], [], 900)
        line = server.stdout.readline() if ready else ""
        if not line:
            err.flush()
            pytest.fail(f"SGLang {version}: the check server gave no answer:\n{(d / 'server.log').read_text()[-3000:]}")
        rc = json.loads(line)["rc"]
        text = log.read_text() if log.exists() else ""
        return rc, json.loads(result.read_text()) if rc == 0 and result.exists() else None, text

    yield check
    server.stdin.close()
    server.kill()  # idle between requests: nothing to finish
    server.wait()
    err.close()


RELEASE_CHECKS = pytest.mark.xdist_group("release_checks")
"""The tests that use ``release_checks`` on one xdist worker (``--dist loadgroup``): one fork server."""


@RELEASE_CHECKS
@pytest.mark.parametrize("version", releases())
def test_adapter_matches_the_release_source(version, release_checks):
    root = _cached(version)
    if root is None and os.environ.get("SPECWATCH_REQUIRE_SGLANG_SRC") == "1":
        pytest.fail(
            f"SPECWATCH_REQUIRE_SGLANG_SRC=1 but {CACHE / version} is not unpacked (scripts/fetch_sglang_sources.sh)"
        )
    if root is None:
        pytest.skip(
            f"no unpacked SGLang {version} in {CACHE}: run scripts/fetch_sglang_sources.sh "
            f"(downloads the wheels, needs network)"
        )
    rc, out, log = release_checks(root, version)
    assert rc == 0 and out is not None, log[-3000:]
    for note in out["notes"]:
        warnings.warn(f"SGLang {version}: {note}", stacklevel=1)
    assert not out["failures"], f"SGLang {version}:\n" + "\n".join(out["failures"])


@RELEASE_CHECKS
def test_a_release_child_that_fails_is_reported_with_its_log(release_checks, tmp_path):
    """A release folder without SGLang's sources: the child exits non-zero and its traceback comes back."""
    rc, out, log = release_checks(tmp_path, "0.5.17")
    assert rc != 0 and out is None and "Traceback" in log


if __name__ == "__main__":
    main(sys.argv)


def test_inspect_survives_a_namespace_package_taking_a_released_name(tmp_path):
    """0.5.15's ``sglang.srt.multimodal`` is a namespace package, 0.5.16's has ``__init__.py``:
    after a swap of releases, ``inspect.getmodule`` (torch calls it when SGLang registers a custom
    op at import) must not trip over the name it noted with a file."""
    import inspect
    import sys
    import types

    from specwatch.rules.release_classes import _take_sglang_modules

    def frame_in(name):
        path = tmp_path / f"{name}.py"
        path.write_text("import sys\ndef here():\n    return sys._getframe()\n")
        scope = {}
        exec(compile(path.read_text(), str(path), "exec"), scope)
        return scope["here"]()

    outer = _take_sglang_modules()
    try:
        later = types.ModuleType("sglang.ns_probe")
        later.__file__ = str(tmp_path / "later_init.py")
        sys.modules["sglang.ns_probe"] = later
        inspect.getmodule(frame_in("first"))  # notes sglang.ns_probe's file
        _take_sglang_modules()  # the release swap
        earlier = types.ModuleType("sglang.ns_probe")
        earlier.__file__ = None  # a namespace package
        sys.modules["sglang.ns_probe"] = earlier
        assert inspect.getmodule(frame_in("second")) is None
    finally:
        _take_sglang_modules()
        sys.modules.update(outer)
