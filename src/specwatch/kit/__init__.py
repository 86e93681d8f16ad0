"""Offline kits: an SGLang release and the GPU-side packages a host lacks for it, as parts of at
most 55 MiB that install without network (docs/offline-kit.md)."""

from specwatch.kit.build import build_kit
from specwatch.kit.host import DEFAULT_HOST, HostProfile
from specwatch.kit.manifest import KitManifest

__all__ = ["build_kit", "DEFAULT_HOST", "HostProfile", "KitManifest"]
