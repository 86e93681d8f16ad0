"""One SGLang release's own allocator and pool classes, imported from its source on the CPU.

``release_classes(version)`` imports a release unpacked by ``scripts/fetch_sglang_sources.sh``
(``release_sizing.cache_dir() / version``) beside the installed SGLang in the same process: its
``sglang`` is a bare package rooted at the unpacked folder (the package ``__init__``, which starts
the serving stack, never runs), and its modules are imported with the installed SGLang's modules
taken out of ``sys.modules``, then put aside again. ``ReleaseClasses.active()`` swaps them back in
for as long as the release's code runs, so an import inside one of its functions reads the same
release. ``installed_classes()`` is the same record for the installed SGLang (nothing to swap).

Which classes: the adapter's names for the release (``rules.releases.adapter_for``):
``ReqToTokenPool``, the paged allocator module (``PagedTokenToKVPoolAllocator``,
``alloc_extend_naive``), the page-1 ``TokenToKVPoolAllocator`` and ``get_num_new_pages``.

Torch, triton and every non-SGLang package are the installed ones (a release's wheel holds only
``sglang/``); packages SGLang imports at module level but the CPU never uses are stubbed where
absent (``core.sglang_host.ensure_import_stubs``, ``setproctitle``).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import inspect
import os
import sys
import types
import warnings
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from specwatch.core.errors import SpecwatchInputError
from specwatch.rules.release_sizing import cache_dir
from specwatch.rules.releases import adapter_for


class ClassOrigin(str, Enum):
    """Where a release's classes were imported from."""

    installed = "installed"
    """The installed SGLang (site-packages)."""
    cached = "cached"
    """An unpacked release under ``release_sizing.cache_dir()``."""


@dataclass(frozen=True)
class ReleaseClasses:
    """The allocator and pool classes of one release, and the modules they came from."""

    version: str
    """The release (``0.5.23``)."""
    root: Path
    """Folder holding the release's ``sglang/``."""
    origin: ClassOrigin
    """Installed SGLang or an unpacked release."""
    req_to_token_pool: type
    """``ReqToTokenPool``."""
    paged_allocator: type
    """``PagedTokenToKVPoolAllocator``."""
    token_allocator: type
    """The page-1 ``TokenToKVPoolAllocator``."""
    alloc_extend_naive: Callable
    """The paged allocator module's host ``alloc_extend_naive``."""
    get_num_new_pages: Callable
    """``get_num_new_pages`` (pages one extend takes)."""
    modules: dict[str, types.ModuleType] = field(default_factory=dict, repr=False, compare=False)
    """The release's ``sglang*`` modules (empty for the installed SGLang: they stay in ``sys.modules``)."""

    @property
    def alloc_extend_on_host(self) -> bool:
        """Whether the release's own ``alloc_extend`` has a torch path (``use_triton_kernels``:
        0.5.23) that runs on the CPU as it is; otherwise it always launches a Triton kernel and the
        caller replaces that launch with ``alloc_extend_naive``."""
        return "use_triton_kernels" in inspect.getsource(self.paged_allocator.alloc_extend)

    def provenance(self) -> dict:
        """What ran, for a result: ``{"version", "origin", "path"}`` (path: the ``sglang/`` folder)."""
        return {"version": self.version, "origin": self.origin.value, "path": str(self.root / "sglang")}

    @contextlib.contextmanager
    def active(self) -> Iterator["ReleaseClasses"]:
        """While inside, ``import sglang...`` reads this release (nothing to do for the installed one)."""
        if not self.modules:
            yield self
            return
        outer = _take_sglang_modules()
        sys.modules.update(self.modules)
        try:
            yield self
        finally:
            self.modules.update(_take_sglang_modules())  # what the release imported meanwhile
            sys.modules.update(outer)


def _take_sglang_modules() -> dict[str, types.ModuleType]:
    """Remove every ``sglang`` module from ``sys.modules`` and return them, and make ``inspect``
    forget the files it noted under their names (``_forget_files``)."""
    names = [k for k in sys.modules if k == "sglang" or k.startswith("sglang.")]
    _forget_files(names)
    return {k: sys.modules.pop(k) for k in names}


def _forget_files(names: list[str]) -> None:
    """Drop ``names`` from ``inspect.getmodule``'s caches. It notes each module's ``__file__`` by
    name and skips a module whose file still matches; one name means another module once the
    releases swap, and a namespace package (``__file__`` None: 0.5.12-0.5.15's
    ``sglang.srt.multimodal``, a package with ``__init__.py`` from 0.5.16) under a name noted with a
    file makes ``getmodule`` raise ``TypeError: ... is a built-in module``. torch calls it when
    SGLang registers a custom op at import, so loading 0.5.15 after a later release failed."""
    by_name = getattr(inspect, "_filesbymodname", None)
    by_file = getattr(inspect, "modulesbyfile", None)
    gone = set(names)
    if isinstance(by_name, dict):
        for name in gone:
            by_name.pop(name, None)
    if isinstance(by_file, dict):
        for f in [f for f, name in by_file.items() if name in gone]:
            del by_file[f]


def _resolve(dotted: str) -> Any:
    """The object at ``dotted`` (a module, or ``module.name``)."""
    try:
        return importlib.import_module(dotted)
    except ModuleNotFoundError as e:
        if e.name != dotted:
            raise
    module, name = dotted.rsplit(".", 1)
    return getattr(importlib.import_module(module), name)


def _stub_absent_packages() -> None:
    """Stand-ins for packages SGLang imports at module level that the CPU never calls."""
    from specwatch.core.sglang_host import ensure_import_stubs

    os.environ.setdefault("SGLANG_DISABLE_REQUEST_LOGGING", "1")
    ensure_import_stubs()
    if "setproctitle" not in sys.modules and importlib.util.find_spec("setproctitle") is None:
        mod = types.ModuleType("setproctitle")
        mod.setproctitle = mod.getproctitle = lambda *a, **k: ""
        sys.modules["setproctitle"] = mod


def _classes(version: str, root: Path, origin: ClassOrigin, modules: dict) -> ReleaseClasses:
    a = adapter_for(version)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        paged = _resolve(a.paged_allocator_module)
        return ReleaseClasses(
            version=version,
            root=root,
            origin=origin,
            req_to_token_pool=_resolve(a.req_to_token_pool_class),
            paged_allocator=paged.PagedTokenToKVPoolAllocator,
            token_allocator=_resolve(a.token_allocator_class),
            alloc_extend_naive=paged.alloc_extend_naive,
            get_num_new_pages=_resolve(a.num_new_pages_fn),
            modules=modules,
        )


@functools.lru_cache(maxsize=None)
def installed_classes() -> ReleaseClasses:
    """The installed SGLang's classes. Raises ImportError when SGLang is not installed."""
    from specwatch.rules.release_sizing import SglangSource

    source = SglangSource.installed()
    if source is None:
        raise ImportError("sglang is not installed")
    _stub_absent_packages()
    return _classes(source.version, source.root, ClassOrigin.installed, {})


def release_root(version: str) -> Path:
    """The unpacked release ``version``; one line naming the folder and ``--release`` when absent."""
    root = cache_dir() / version
    if not (root / ".complete").exists() or not (root / "sglang").is_dir():
        raise SpecwatchInputError(
            root,
            f"SGLang {version}'s source is not unpacked here (COMPILE=0 bash scripts/fetch_sglang_sources.sh {version})",
            field="--release",
        )
    return root


def release_classes(version: str, root: Optional[Path] = None) -> ReleaseClasses:
    """``version``'s classes from its unpacked source (``root``; default ``cache_dir() / version``)."""
    root = Path(root) if root is not None else release_root(version)
    return _release_classes(version, root.resolve())


@functools.lru_cache(maxsize=None)
def _release_classes(version: str, root: Path) -> ReleaseClasses:
    adapter_for(version)  # an unknown release: one line before anything is imported
    if not (root / "sglang").is_dir():
        raise SpecwatchInputError(root, "no sglang/ package here", field="--release")
    _stub_absent_packages()
    outer = _take_sglang_modules()
    try:
        pkg = types.ModuleType("sglang")
        pkg.__path__ = [str(root / "sglang")]
        pkg.__file__ = str(root / "sglang" / "__init__.py")
        sys.modules["sglang"] = pkg
        classes = _classes(version, root, ClassOrigin.cached, {})
        classes.modules.update(_take_sglang_modules())
        return classes
    finally:
        sys.modules.update(outer)
