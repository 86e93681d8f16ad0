"""SGLang's own sizing functions and ``ReqToTokenPool``, run from one release's source files.

``SglangSource`` is a release's Python source: the installed SGLang's (``installed()``) or a
release unpacked by ``scripts/fetch_sglang_sources.sh`` (``cached(version)``). Its ``sizing(x)``
calls that release's functions, as the release's adapter (``rules.releases``) names them, through
``rules.sglang_source.SourceTree``: only those definitions execute, so no torch and none of
SGLang's 5,200 modules load (about 0.1 s instead of 6-10 s).

Two stand-ins, both at the boundary SGLang's functions read through:

* 0.5.18+ read the published runtime context (``get_spec()``, ``get_schedule()``,
  ``get_parallel()``); they get the configuration's namespaces (``runtime_context``'s own
  ``max_speculative_num_draft_tokens`` runs on them);
* ``ReqToTokenPool.__init__`` runs with a shape-only ``torch`` (``zeros`` records shape and dtype),
  which is what the ``meta`` device gives a real tensor.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Optional

from specwatch.rules.releases import SizingArgs, adapter_for
from specwatch.rules.sglang_source import SourceTree

CACHE_ENV = "SPECWATCH_SGLANG_SRC"
"""Folder of unpacked release sources (default: the repository's ``.cache/sglang-src``)."""
REQUIRE_ENV = "SPECWATCH_REQUIRE_SGLANG_SRC"
"""``1``: tests that need a cached release fail instead of skipping when it is absent."""


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path(__file__).resolve().parents[3] / ".cache" / "sglang-src")


class _DType:
    def __init__(self, name: str, itemsize: int):
        self.name, self.itemsize = name, itemsize


class _ShapeTensor:
    """What a ``meta``-device tensor tells: shape and element size."""

    def __init__(self, shape, dtype: _DType):
        self.shape = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
        self.dtype = dtype

    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    def element_size(self) -> int:
        return self.dtype.itemsize


SHAPE_TORCH = SimpleNamespace(
    int32=_DType("int32", 4),
    int64=_DType("int64", 8),
    zeros=lambda shape, dtype=None, device=None, **_: _ShapeTensor(shape, dtype or SHAPE_TORCH.float32),
    float32=_DType("float32", 4),
)
"""The ``torch`` that ``ReqToTokenPool.__init__`` sees here."""


class _Context:
    """The runtime-context bags 0.5.18+'s sizing functions read; set before each call."""

    spec: SimpleNamespace = SimpleNamespace()
    schedule: SimpleNamespace = SimpleNamespace()
    parallel: SimpleNamespace = SimpleNamespace()


@dataclass(frozen=True)
class SglangSource:
    """One release's Python source."""

    root: Path
    """Folder holding ``sglang/``."""
    version: str
    """The release (``0.5.23``)."""

    @classmethod
    @functools.lru_cache(maxsize=None)
    def installed(cls) -> Optional["SglangSource"]:
        """The installed SGLang's source (without importing it); None when not installed."""
        from importlib.metadata import PackageNotFoundError, version

        try:
            spec = importlib.util.find_spec("sglang")
            v = version("sglang")
        except (ImportError, PackageNotFoundError, ValueError):
            return None
        if spec is None or not spec.submodule_search_locations:
            return None
        return cls(Path(list(spec.submodule_search_locations)[0]).parent, v)

    @classmethod
    @functools.lru_cache(maxsize=None)
    def cached(cls, version: str) -> Optional["SglangSource"]:
        """The unpacked release ``version`` in ``cache_dir()``; None when absent."""
        d = cache_dir() / version
        return cls(d, version) if (d / ".complete").exists() else None

    def __hash__(self):
        return hash((self.root, self.version))

    @functools.cached_property
    def _tree(self) -> SourceTree:
        ctx = _Context
        return SourceTree(
            self.root,
            {
                "sglang.srt.runtime_context": {
                    "get_spec": lambda: ctx.spec,
                    "get_schedule": lambda: ctx.schedule,
                    "get_parallel": lambda: ctx.parallel,
                },
                "sglang.srt.mem_cache.memory_pool": {"torch": SHAPE_TORCH},
            },
        )

    def get(self, dotted: str):
        """The object at ``dotted`` (``module.name``) from this source."""
        module, name = dotted.rsplit(".", 1)
        return self._tree.get(module, name)

    def knows(self, algorithm: Optional[str]) -> bool:
        """Whether this release's ``SpeculativeAlgorithm`` has ``algorithm`` (None: always)."""
        if algorithm is None:
            return True
        members = self.get("sglang.srt.speculative.spec_info.SpeculativeAlgorithm").__members__
        return algorithm.upper() in members

    def sizing(self, args: SimpleNamespace) -> dict:
        """This release's sizing of ``args`` (``memory_model.server_args_for``): alloc len, reserve,
        row headroom, admission reserve (None where the release computes it inline) and the
        req_to_token pool's row width and bytes for ``args.max_running_requests`` requests."""
        a = adapter_for(self.version)
        if a.sizing_args is SizingArgs.runtime_context:
            _Context.spec = args
            _Context.schedule = SimpleNamespace(page_size=args.page_size)
            _Context.parallel = SimpleNamespace(attn_dcp_size=args.dcp_size)
            call = lambda dotted: self.get(dotted)()  # noqa: E731
        else:
            call = lambda dotted: self.get(dotted)(args)  # noqa: E731
        alloc = call(a.alloc_len_fn)
        reserve = call(a.alloc_reserve_fn) if a.alloc_reserve_fn else 2 * alloc
        if a.extra_context_len_fn is None:
            raise NotImplementedError(f"SGLang {self.version} sizes the row inline ({a.row_sizing_site})")
        extra = call(a.extra_context_len_fn)
        pool = self.get(a.req_to_token_pool_class)(
            size=args.max_running_requests,
            max_context_len=args.context_len + extra,
            device="meta",
            enable_memory_saver=False,
        )
        t = pool.req_to_token
        return dict(
            alloc_len_per_decode=int(alloc),
            alloc_reserve_per_decode=int(reserve),
            req_to_token_extra_context_len=int(extra),
            req_to_token_row_width=int(t.shape[1]),
            req_to_token_bytes=int(t.numel() * t.element_size()),
            reserved_tokens_at_admission=None if a.reserved_tokens_fn is None else int(call(a.reserved_tokens_fn)),
        )
