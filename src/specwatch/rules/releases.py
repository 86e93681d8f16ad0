"""Where each SGLang release keeps what specwatch reaches into: one adapter per release range.

specwatch drives the installed SGLang and reads its internals: the host-side sizing functions,
allocator and pool classes (CPU tier, ``core.sglang_host``), the functions its faults edit with
SGLang's source patcher (``inject.faults``), the scheduler attributes the probe reads
(``inject.probe``), the engine arguments and ``meta_info`` keys the worker uses (``worker``).
Those names move between releases. ``ReleaseAdapter`` (``rules.release_model``) holds them for a
range of releases, ``rules.release_ranges.ADAPTERS`` lists the ranges; ``adapter_for(version)``
picks the range, and refuses a version outside every known range (``UnknownReleaseError``)
instead of guessing. ``fault_plan`` turns a fault's site in one release into what the probe
applies, and refuses a fault the release has no edit for (``FaultNotInRelease``), naming why.
"""

from __future__ import annotations

from typing import Optional

from specwatch.core.errors import SpecwatchInputError
from specwatch.inject.faults import FaultEdit, FaultPlan, get, hit_expression
from specwatch.rules.release_model import (
    FaultSite,
    ReleaseAdapter,
    ServerArgsFields,
    SizingArgs,
    WatermarkSite,
)
from specwatch.rules.release_ranges import ADAPTERS

__all__ = [
    "ADAPTERS",
    "FaultNotInRelease",
    "FaultSite",
    "ReleaseAdapter",
    "ServerArgsFields",
    "SizingArgs",
    "UnknownReleaseError",
    "WatermarkSite",
    "adapter_for",
    "fault_plan",
    "installed_version",
    "releases",
    "running_version",
]


class UnknownReleaseError(SpecwatchInputError):
    """An SGLang version outside every release range ``ADAPTERS`` knows."""


def _release(version: str) -> tuple[int, ...]:
    from packaging.version import InvalidVersion, Version

    try:
        return Version(version).release
    except InvalidVersion:
        raise UnknownReleaseError(
            None, f"SGLang version {version!r} is no PEP 440 version", field="sglang version"
        ) from None


def adapter_for(version: str) -> ReleaseAdapter:
    """The adapter of the range holding ``version`` (``0.5.17``, ``0.5.17.post1``, ``0.5.17rc1``
    and ``0.5.17+g0123456789ab`` all read as release 0.5.17). Raises ``UnknownReleaseError``
    naming the release for a version outside every range: what moved in an unknown release is
    not known, so nothing is assumed."""
    rel = _release(version)
    for a in ADAPTERS:
        if _release(a.first) <= rel <= _release(a.last):
            return a
    raise UnknownReleaseError(
        None,
        f"SGLang {version} is outside every release range specwatch knows "
        f"({ADAPTERS[0].first} to {ADAPTERS[-1].last}); add its adapter to specwatch/rules/releases.py "
        f"(scripts/fetch_sglang_sources.sh fetches its source, tests/test_releases.py checks it)",
        field="sglang version",
    )


def releases() -> list[str]:
    """Every release the adapters cover, oldest first (``0.5.X``, patch releases in between)."""
    out = []
    for a in ADAPTERS:
        lo, hi = _release(a.first), _release(a.last)
        out += [".".join(map(str, lo[:-1] + (p,))) for p in range(lo[-1], hi[-1] + 1)]
    return out


class FaultNotInRelease(SpecwatchInputError):
    """A fault the release has no edit for: running it would measure the release clean and call
    the fault not caught."""


def installed_version() -> str:
    """The installed SGLang's version, from its distribution metadata (no import of SGLang)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sglang")
    except PackageNotFoundError:
        raise SpecwatchInputError(None, "SGLang is not installed here", field="sglang version") from None


def running_version() -> str:
    """The SGLang this process drives: the imported ``sglang`` module's version (an engine in the
    worker), else the installed distribution's."""
    try:
        import sglang

        return getattr(sglang, "__version__", None) or installed_version()
    except ImportError:
        return installed_version()


def fault_plan(name: str, version: Optional[str] = None) -> FaultPlan:
    """Fault ``name`` as SGLang ``version`` (default: the installed one) needs it applied. Raises
    ``FaultNotInRelease`` with the adapter's reason where the release has no edit for it, and
    ``ValueError`` for an unknown fault."""
    fault = get(name)
    version = version or installed_version()
    a = adapter_for(version)
    if not fault.edits_source:
        if name == "draft-page-mismatch" and not a.draft_pool_page_size_property:
            raise FaultNotInRelease(
                None,
                f"SGLang {version} has no KVCacheConfigurator.pool_page_size property for draft-page-mismatch to swap",
                field=name,
            )
        return FaultPlan(name, version, tuple(FaultEdit(m) for m in fault.patch_modules))
    site = a.faults.get(name)
    if site is None:
        why = a.faults_absent.get(name, "no edit known for this release")
        raise FaultNotInRelease(None, f"no edit in SGLang {version}: {why}", field=name)
    sites = [site] + ([a.dflash_faults[name]] if name in a.dflash_faults else [])
    return FaultPlan(name, version, tuple(FaultEdit(s.module, s.patch_yaml(hit_expression(name))) for s in sites))
