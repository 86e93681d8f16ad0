"""Packing wheels into part folders of at most a given size.

A wheel larger than a part's payload is cut into byte chunks (``NAME.whl.000``, ``.001``, ...);
whole wheels and chunks are then packed first-fit by decreasing size. Every part folder gets the
payload, a copy of ``install.sh`` and a copy of the manifest.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from specwatch.kit.wheels import file_sha256

MiB = 1 << 20
DEFAULT_PART_LIMIT = 55 * MiB
"""Most bytes one part folder holds, install.sh and manifest included."""


def overhead_estimate(installer_bytes: int, wheels: int, pieces: int) -> int:
    """Room to keep in every part for install.sh and the manifest (generous: a wheel's entry in
    the manifest takes about 500 bytes, a file's about 200)."""
    return installer_bytes + 1024 * wheels + 400 * pieces + 8192


@dataclass(frozen=True)
class Piece:
    """A byte range of a wheel that becomes one file of a part."""

    source: Path
    """The wheel it comes from."""
    name: str
    """Its file name in the part (the wheel's name, or the wheel's name plus ``.NNN``)."""
    offset: int
    """First byte within the wheel."""
    length: int
    """Bytes."""


def pieces_of(wheel: Path, max_piece: int) -> list[Piece]:
    """The wheel whole when it fits in ``max_piece`` bytes, else its consecutive chunks."""
    size = wheel.stat().st_size
    if size <= max_piece:
        return [Piece(wheel, wheel.name, 0, size)]
    return [
        Piece(wheel, f"{wheel.name}.{i:03d}", offset, min(max_piece, size - offset))
        for i, offset in enumerate(range(0, size, max_piece))
    ]


def plan_parts(pieces: list[Piece], payload_limit: int) -> list[list[Piece]]:
    """Pieces grouped into parts of at most ``payload_limit`` bytes (first fit, largest first);
    within a part, pieces keep the order they came in."""
    order = {p.name: i for i, p in enumerate(pieces)}
    parts: list[list[Piece]] = []
    room: list[int] = []
    for piece in sorted(pieces, key=lambda p: (-p.length, order[p.name])):
        if piece.length > payload_limit:
            raise ValueError(f"{piece.name}: {piece.length} bytes exceed a part's {payload_limit}")
        for i, left in enumerate(room):
            if piece.length <= left:
                parts[i].append(piece)
                room[i] -= piece.length
                break
        else:
            parts.append([piece])
            room.append(payload_limit - piece.length)
    return [sorted(part, key=lambda p: order[p.name]) for part in parts]


def write_piece(piece: Piece, folder: Path) -> Path:
    """Copy the piece's bytes into ``folder`` (a hard link when it is the whole wheel)."""
    target = folder / piece.name
    if piece.offset == 0 and piece.length == piece.source.stat().st_size:
        try:
            os.link(piece.source, target)
            return target
        except OSError:
            shutil.copyfile(piece.source, target)
            return target
    with open(piece.source, "rb") as src, open(target, "wb") as dst:
        src.seek(piece.offset)
        left = piece.length
        while left:
            block = src.read(min(left, 8 * MiB))
            dst.write(block)
            left -= len(block)
    return target


def part_digest(files: list[Path]) -> str:
    """sha256 of the files' bytes concatenated in order."""
    digest = hashlib.sha256()
    for path in files:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(MiB), b""):
                digest.update(block)
    return digest.hexdigest()


def part_name(index: int) -> str:
    return f"part-{index:02d}"


def file_entry(path: Path) -> dict:
    return {"name": path.name, "sha256": file_sha256(path), "size": path.stat().st_size}
