"""What SGLang's HTTP server and serving benchmark import at start, against what a kit provides.

For each release's unpacked source (``scripts/fetch_sglang_sources.sh``), the module-level import
closure of ``sglang.launch_server``, ``sglang.srt.entrypoints.http_server`` and the serving
benchmark is followed through SGLang's own modules (and the package ``__init__`` files on the
way). Every top-level module outside SGLang and the standard library must be in :data:`PROVIDERS`,
which says which distribution provides it and how it reaches the host: a distribution the kit
follows (``kit``), a dependency of one (``dep``), the host's own (``host``), or a module that only
another accelerator's or an opt-in path imports (``elsewhere``). A new import fails here rather
than as a server that exits at start on the GPU host (0.5.17 on an H200 host: ``ModuleNotFoundError:
No module named 'jsonschema'`` from ``entrypoints/openai/serving_chat.py`` at every start).

Imports under ``if TYPE_CHECKING``, ``if __name__ == "__main__"`` and in ``try`` blocks that catch
``ImportError`` (or any ``Exception``) are left out: they do not stop an import. Imports inside
other ``if`` blocks are followed (a CUDA host takes most such branches); only those are allowed to
be ``elsewhere``.
"""

from __future__ import annotations

import ast
import functools
import os
import sys
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Literal

import pytest
from packaging.utils import canonicalize_name
from packaging.version import Version

from specwatch.kit.host import DEFAULT_HOST
from specwatch.kit.pins import top_level_requirements
from specwatch.kit.releases import rules_for
from specwatch.kit.wheels import Wheel
from specwatch.rules.release_serving import serving_benchmark_for
from specwatch.rules.release_sizing import REQUIRE_ENV, cache_dir
from specwatch.rules.releases import releases


@dataclass(frozen=True)
class Provider:
    """Where an imported top-level module comes from on the host."""

    dist: str
    """The distribution that installs the module."""

    how: Literal["kit", "dep", "host", "elsewhere"]
    """``kit``: the kit follows ``dist`` (SGLang's METADATA and ``SERVING_PATH``, or a carry rule),
    carried unless the host serves the requirement; ``dep``: a requirement of ``parent``, which the
    kit follows; ``host``: the host's own (``DEFAULT_HOST.installed``); ``elsewhere``: imported only
    on another accelerator or an opt-in path, never by a default start on a CUDA host."""

    why: str
    """Where SGLang imports it."""

    parent: str = ""
    """For ``dep``: the followed distribution that requires ``dist`` (read off a built kit's
    manifest, ``required_by``)."""


def kit(dist: str, why: str) -> Provider:
    return Provider(dist, "kit", why)


def dep(dist: str, parent: str, why: str) -> Provider:
    return Provider(dist, "dep", why, parent)


def host(dist: str, why: str) -> Provider:
    return Provider(dist, "host", why)


def elsewhere(why: str) -> Provider:
    return Provider("", "elsewhere", why)


PROVIDERS: dict[str, Provider] = {
    # SGLang's own requirements that SERVING_PATH names
    "aiohttp": kit("aiohttp", "sglang/__init__ (lang/backend/runtime_endpoint.py), the benchmark"),
    "compressed_tensors": kit("compressed-tensors", "quantization configs (layers/quantization)"),
    "datasets": kit("datasets", "the benchmark's MMMU and LongBench loaders"),
    "fastapi": kit("fastapi", "http_server's app"),
    "flashinfer": kit("flashinfer-python", "attention, sampling and quantization layers"),
    "gguf": kit("gguf", "layers/quantization/gguf.py"),
    "msgspec": kit("msgspec", "IPC structs, the benchmark"),
    "openai": kit("openai", "entrypoints/openai/protocol.py"),
    "orjson": kit("orjson", "utils/common.py, the benchmark"),
    "partial_json_parser": kit("partial-json-parser", "function_call parsers"),
    "pybase64": kit("pybase64", "utils/common.py"),
    "pydantic": kit("pydantic", "io_struct, the OpenAI protocol"),
    "sentencepiece": kit("sentencepiece", "configs/internvl.py"),
    "setproctitle": kit("setproctitle", "the scheduler and data-parallel controller"),
    "sgl_kernel": kit("sglang-kernel", "kernels and quantization layers"),
    "soundfile": kit("soundfile", "entrypoints/openai/audio_chunking.py and realtime"),
    "torch": kit("torch", "everywhere (the host's where it serves SGLang's pin, else carried)"),
    "transformers": kit("transformers", "model configs, the benchmark's tokenizer"),
    "tvm_ffi": kit("apache-tvm-ffi", "JIT kernels (kernels/ops)"),
    "uvicorn": kit("uvicorn", "http_server"),
    "uvloop": kit("uvloop", "http_server"),
    "xgrammar": kit("xgrammar", "function_call detectors"),
    "zmq": kit("pyzmq", "utils/network.py, the scheduler's IPC"),
    "zstandard": kit("zstandard", "http_request_decompression.py"),
    # carried by RELEASE_RULES (SGLang's METADATA does not name them, or SERVING_PATH does not)
    "IPython": kit("ipython", "sglang/utils.py"),
    "deep_gemm": kit("sgl-deep-gemm", "layers/deep_gemm_wrapper (JIT DeepGEMM, on by default)"),
    "dill": kit("dill", "sampling/custom_logit_processor.py"),
    "jsonschema": kit("jsonschema", "entrypoints/openai/serving_chat.py (SGLang has it only through outlines)"),
    # requirements of followed distributions
    "einops": dep("einops", "flashinfer-python", "mamba kernels, eplb"),
    "pydantic_core": dep("pydantic-core", "pydantic", "utils/msgspec_utils.py"),
    "starlette": dep("starlette", "fastapi", "http_server, utils/common.py"),
    "triton": dep("triton", "torch", "kernels everywhere"),
    "typing_extensions": dep("typing-extensions", "pydantic", "utils/common.py"),
    # the host's own
    "PIL": host("pillow", "utils/common.py"),
    "filelock": host("filelock", "model_loader/weight_utils.py"),
    "huggingface_hub": host("huggingface-hub", "utils/hf_transformers"),
    "jinja2": host("jinja2", "serving_chat, parser/template_detection.py"),
    "numpy": host("numpy", "everywhere, the benchmark"),
    "packaging": host("packaging", "utils/common.py"),
    "psutil": host("psutil", "utils/common.py"),
    "regex": host("regex", "function_call, quantization"),
    "requests": host("requests", "utils/common.py, the benchmark"),
    "safetensors": host("safetensors", "connector/serde"),
    "torchvision": host(
        "torchvision",
        "utils/common.py to 0.5.22, multimodal (built for the host's torch: a kit that carries "
        "torch needs specwatch's stub, docs/offline-kit.md)",
    ),
    "tqdm": host("tqdm", "lang/interpreter.py, the benchmark"),
    "yaml": host("pyyaml", "debug_utils, multiplex"),
    # another accelerator or an opt-in path
    "aiter": elsewhere("ROCm only (if _use_aiter ...)"),
    "flash_attn_interface": elsewhere("MUSA only (if _is_musa)"),
    "mlx": elsewhere("Apple only (managers/scheduler.py: if is_mps())"),
    "modelscope": elsewhere("only with SGLANG_USE_MODELSCOPE set"),
    "nvtx": elsewhere("only with SGLANG_OPERATIONS_ENABLE_PROFILE set (0.5.12-0.5.13)"),
    "sgl_kernel_npu": elsewhere("Ascend only (if _is_npu)"),
    "torch_npu": elsewhere("Ascend only (if _is_npu)"),
}
"""Each top-level module the server or its benchmark imports at start, and who provides it."""

SERVER_MODULES = ("sglang.launch_server", "sglang.srt.entrypoints.http_server")
"""Where ``python -m sglang.launch_server`` starts (the benchmark's module is added per release)."""

_NEVER_RUN = {"TYPE_CHECKING", "typing.TYPE_CHECKING", "__name__ == '__main__'"}
_CAUGHT = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}


def _module_file(src: Path, module: str) -> Path | None:
    base = src.joinpath(*module.split("."))
    for f in (base.with_suffix(".py"), base / "__init__.py"):
        if f.is_file():
            return f
    return None


def _catches_import_errors(node: ast.Try) -> bool:
    for handler in node.handlers:
        types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
        if handler.type is None or any(isinstance(t, ast.Name) and t.id in _CAUGHT for t in types):
            return True
    return False


def _imported(node: ast.stmt, package: str) -> list[str]:
    """The modules an import statement names (``from a import b``: ``a`` and ``a.b``)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    module = node.module
    if node.level:
        parts = package.split(".")
        module = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
    return [module] + [f"{module}.{a.name}" for a in node.names]


def _file_imports(path: Path, package: str) -> tuple[tuple[str, bool], ...]:
    """The modules a file imports when it is imported, each with whether an ``if`` block holds it."""
    return _text_imports(path.read_text(), package)


def _module_level(text: str) -> str:
    """The source without its top-level ``def`` and ``class`` blocks (decorators included), which
    hold no import that runs at import time here, and cost most of the parse: parsing the rest
    takes a tenth of the time, with the same imports found in every file of releases
    0.5.12-0.5.23 (10024 files; 24 whose cut source does not parse are parsed whole)."""
    kept, skipping = [], False
    for line in text.split("\n"):
        if line and line[0] not in " \t#)]}":  # a new top-level statement
            skipping = line.startswith(("def ", "async def ", "class ", "@"))
        if not skipping:
            kept.append(line)
    return "\n".join(kept)


@functools.lru_cache(maxsize=None)
def _text_imports(text: str, package: str) -> tuple[tuple[str, bool], ...]:
    """``_file_imports`` by content: most files are the same in consecutive releases, parsed once."""
    try:
        tree = ast.parse(_module_level(text))
    except SyntaxError:
        tree = ast.parse(text)
    found: list[tuple[str, bool]] = []
    stack = [(node, False) for node in tree.body]
    while stack:
        node, in_if = stack.pop()
        if isinstance(node, ast.If):
            if ast.unparse(node.test) not in _NEVER_RUN:
                stack += [(n, True) for n in node.body + node.orelse]
        elif isinstance(node, ast.Try):
            body = [] if _catches_import_errors(node) else node.body
            stack += [(n, in_if) for n in body + node.orelse + node.finalbody]
        elif isinstance(node, ast.With):
            stack += [(n, in_if) for n in node.body]
        found += [(module, in_if) for module in _imported(node, package)]
    return tuple(found)


@functools.lru_cache(maxsize=None)
def import_closure(src: Path, roots: tuple[str, ...], *, branches: bool = True) -> tuple[dict[str, str], set[str]]:
    """Top-level modules outside SGLang that importing ``roots`` imports (each with the SGLang module
    that imports it first), and the SGLang modules visited. ``branches=False`` leaves every ``if``
    block out (what is imported whatever the host)."""
    outside: dict[str, str] = {}
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        path = _module_file(src, name)
        if name in seen or path is None:
            continue
        seen.add(name)
        parts = name.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]  # the packages on the way
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for module, in_if in _file_imports(path, package):
            top = module.split(".")[0]
            if in_if and not branches:
                continue
            if top == "sglang":
                todo.append(module)
            elif top not in sys.stdlib_module_names:
                outside.setdefault(top, name)
    return outside, seen


class SourceWheel(Wheel):
    """A release's unpacked source standing in for its wheel: its ``dist-info/METADATA``."""

    @cached_property
    def metadata(self):
        from email.parser import HeaderParser

        folder = self.path.parent / f"sglang-{self.version}.dist-info"
        return HeaderParser().parsestr((folder / "METADATA").read_text())


def followed(src: Path) -> set[str]:
    """What the kit builder follows from this release's METADATA and its rules."""
    wheel = SourceWheel(src / f"sglang-{src.name}-py3-none-any.whl")
    return {canonicalize_name(r.name) for r in top_level_requirements(wheel, DEFAULT_HOST, cubin=False)}


def _sources() -> list[Path]:
    return [
        cache_dir() / v for v in releases() if (cache_dir() / v / "sglang/srt/entrypoints/http_server.py").is_file()
    ]


def _source(version: str) -> Path:
    """The release's unpacked source; skips without it (fails with ``SPECWATCH_REQUIRE_SGLANG_SRC=1``)."""
    src = cache_dir() / version
    if not (src / "sglang/srt/entrypoints/http_server.py").is_file():
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{REQUIRE_ENV}=1 but {src} is not unpacked (scripts/fetch_sglang_sources.sh)")
        pytest.skip(f"no unpacked SGLang {version} in {cache_dir()} (scripts/fetch_sglang_sources.sh)")
    return src


def _roots(src: Path) -> tuple[str, ...]:
    return (*SERVER_MODULES, serving_benchmark_for(src.name).module)


@pytest.mark.parametrize("version", releases())
def test_every_module_the_server_imports_at_start_has_a_provider_the_kit_honours(version):
    src = _source(version)
    outside, seen = import_closure(src, _roots(src))
    assert {"sglang.srt.entrypoints.openai.serving_chat", serving_benchmark_for(version).module} <= seen
    unknown = {m: by for m, by in outside.items() if m not in PROVIDERS}
    assert not unknown, f"{version}: imported at start (module: by), no row in PROVIDERS: {unknown}"
    assert not provider_problems(src, outside)


def provider_problems(src: Path, outside: dict[str, str]) -> list[str]:
    """Each imported module whose provider does not hold for this release, in one line each."""
    kit_follows = followed(src)
    omitted = {canonicalize_name(r.name) for r in rules_for(Version(src.name), cubin=False) if r.action == "omit"}
    unconditional, _ = import_closure(src, _roots(src), branches=False)
    problems = []
    for module in sorted(outside):
        p = PROVIDERS[module]
        where = f"{module} (imported by {outside[module]})"
        if p.how == "kit" and canonicalize_name(p.dist) not in kit_follows:
            problems.append(f"{where}: the kit does not follow {p.dist}")
        elif p.how == "dep" and canonicalize_name(p.parent) not in kit_follows:
            problems.append(f"{where}: the kit does not follow {p.parent}, which brings {p.dist}")
        elif p.how == "dep" and canonicalize_name(p.dist) in omitted:
            problems.append(f"{where}: a release rule omits {p.dist}")
        elif p.how == "host" and canonicalize_name(p.dist) not in DEFAULT_HOST.installed:
            problems.append(f"{where}: DEFAULT_HOST does not have {p.dist}")
        elif p.how == "elsewhere" and module in unconditional:
            problems.append(f"{where}: imported outside any if block, so on a CUDA host too")
    return problems


def test_every_provider_row_is_imported_by_some_release():
    """A row no release imports any more is dropped, so the table stays what is measured."""
    sources = _sources()
    if len(sources) < len(releases()):
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{REQUIRE_ENV}=1 but only {len(sources)} of {len(releases())} releases are unpacked")
        pytest.skip("not every release is unpacked (scripts/fetch_sglang_sources.sh)")
    reached = set().union(*(import_closure(src, _roots(src))[0] for src in sources))
    assert set(PROVIDERS) - reached == set()


def test_the_closure_follows_what_runs_at_import_and_a_new_import_has_no_provider(tmp_path):
    pkg = tmp_path / "sglang"
    (pkg / "srt").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from .srt import server\n")
    (pkg / "srt" / "__init__.py").write_text("")
    (pkg / "srt" / "server.py").write_text(
        "import os\nfrom typing import TYPE_CHECKING\nimport fastapi\n"
        "if TYPE_CHECKING:\n    import checked_only\n"
        "try:\n    import optional_pkg\nexcept ImportError:\n    optional_pkg = None\n"
        "if os.environ.get('X'):\n    import torch_npu\n"
        "def f():\n    import lazy_pkg\n"
        "@decorated\nclass C:\n    import in_class\n"
        "from .helper import g\n"
    )
    (pkg / "srt" / "helper.py").write_text("import brand_new_pkg\n")
    outside, seen = import_closure(tmp_path, ("sglang.srt.server",))
    assert set(outside) == {"fastapi", "torch_npu", "brand_new_pkg"}
    assert {"sglang", "sglang.srt", "sglang.srt.server", "sglang.srt.helper"} <= seen
    assert set(import_closure(tmp_path, ("sglang.srt.server",), branches=False)[0]) == {"fastapi", "brand_new_pkg"}
    assert [m for m in outside if m not in PROVIDERS] == ["brand_new_pkg"]
