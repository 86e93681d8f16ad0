"""Access to the installed SGLang's host-side code (sizing functions, pools, allocators).

Imported lazily: specwatch works without SGLang, and only the CPU-tier comparisons and the
GPU runner need it.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import sys
import warnings
from pathlib import Path
from typing import Optional

STUBS_DIR = Path(__file__).resolve().parents[1] / "_stubs"
"""Import stubs for packages SGLang imports at module level but the CPU tier never uses
(``torchvision``: its PyPI wheels need a CUDA torch). Used only where the real one is absent."""


def ensure_import_stubs() -> None:
    """Put the stubs on sys.path where the real packages are absent. Call it before anything imports
    ``transformers``: transformers decides once, at import, whether torchvision exists, and SGLang's
    module-level image-processor imports fail if it decided "no"."""
    if importlib.util.find_spec("torchvision") is None and str(STUBS_DIR) not in sys.path:
        sys.path.append(str(STUBS_DIR))


_ensure_import_stubs = ensure_import_stubs


def _quiet_import(name: str):
    os.environ.setdefault("SGLANG_DISABLE_REQUEST_LOGGING", "1")
    _ensure_import_stubs()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return importlib.import_module(name)


@functools.lru_cache(maxsize=None)
def sizing_module():
    """``sglang.srt.mem_cache.allocation_sizing``."""
    return _quiet_import("sglang.srt.mem_cache.allocation_sizing")


@functools.lru_cache(maxsize=None)
def num_reserved_tokens_fn():
    """``sglang.srt.managers.utils.compute_num_reserved_tokens`` (admission reserve per request)."""
    return _quiet_import("sglang.srt.managers.utils").compute_num_reserved_tokens


@functools.lru_cache(maxsize=None)
def req_to_token_pool_class():
    return _quiet_import("sglang.srt.mem_cache.memory_pool").ReqToTokenPool


@functools.lru_cache(maxsize=None)
def paged_allocator_module():
    """``sglang.srt.mem_cache.allocator.paged`` (PagedTokenToKVPoolAllocator, alloc_extend_naive)."""
    return _quiet_import("sglang.srt.mem_cache.allocator.paged")


@functools.lru_cache(maxsize=None)
def get_num_new_pages():
    return _quiet_import("sglang.srt.utils.common").get_num_new_pages


VERSION_ENV = "SPECWATCH_SGLANG_VERSION"
"""The SGLang version in question when it is not the installed one: a commit overlay's recorded
version (``0.5.17+g0123456789ab``), or the version whose records asv benchmarks read."""
COMMIT_ENV = "SPECWATCH_SGLANG_COMMIT"
"""The SGLang commit recorded in provenance (commit overlays set it)."""


def sglang_version() -> Optional[str]:
    """``VERSION_ENV`` when set, else the installed sglang version without importing it (None when
    not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    if os.environ.get(VERSION_ENV):
        return os.environ[VERSION_ENV]

    try:
        return version("sglang")
    except PackageNotFoundError:
        return None


def sglang_importable() -> bool:
    try:
        sizing_module()
        return True
    except Exception:
        return False


def version_key(v: str):
    """Sort key for SGLang versions (PEP 440; anything else after every valid version)."""
    from packaging.version import InvalidVersion, Version

    try:
        return (0, Version(str(v)))
    except InvalidVersion:
        return (1, str(v))
