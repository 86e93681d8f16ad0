"""Leaving sglang-kernel's FA3 library out of its wheel (``fa3=False``).

``sgl_kernel/flash_ops.abi3.so`` is FlashAttention 3: about 1.1 GB unpacked, most of
sglang-kernel's wheel, and needed only for ``attention_backend="fa3"``. Without it, the triton and
flashinfer backends work as usual.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

from specwatch.kit.wheels import Wheel

FA3_MEMBER_PREFIX = "sgl_kernel/flash_ops."
"""Wheel members that make up FA3."""


def without_fa3(wheel: Wheel, out_dir: Path) -> Wheel:
    """A copy of the sglang-kernel wheel without FA3 (same file name), cached in ``out_dir``."""
    target = out_dir / wheel.path.name
    if target.is_file():
        return Wheel(target)
    out_dir.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".tmp")
    with zipfile.ZipFile(wheel.path) as src, zipfile.ZipFile(partial, "w", compression=zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            if info.filename.startswith(FA3_MEMBER_PREFIX):
                continue
            data = src.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                data = b"".join(
                    line for line in data.splitlines(keepends=True) if not line.startswith(FA3_MEMBER_PREFIX.encode())
                )
            dst.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
    partial.rename(target)
    return Wheel(target)
