"""The kit's manifest: what it carries, how it is split into parts, and every checksum."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from pydantic import BaseModel, ConfigDict

MANIFEST_NAME = "manifest.json"
"""File name of the manifest (a copy lies in every part)."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class KitWheel(_Model):
    """One wheel the kit carries."""

    name: str
    """Canonical distribution name."""
    version: str
    """Its version."""
    filename: str
    """The wheel's file name (as pip needs it)."""
    sha256: str
    """Hex sha256 of the whole wheel."""
    size: int
    """Bytes."""
    requirement: str
    """The requirement it was chosen for."""
    required_by: str
    """What asked for it first."""
    chunks: list[str]
    """Files that, concatenated in this order, give the wheel (``[filename]`` if not split)."""


class KitFile(_Model):
    """One file of a part."""

    name: str
    """File name (unique across the kit)."""
    sha256: str
    """Hex sha256."""
    size: int
    """Bytes."""


class KitPart(_Model):
    """One part: a folder copied to the host as a unit."""

    name: str
    """Folder name (``part-00``)."""
    files: list[KitFile]
    """Its payload files (besides install.sh and the manifest)."""
    size: int
    """Payload bytes."""
    sha256: str
    """Hex sha256 of the payload files concatenated in order."""


class KitBase(_Model):
    """The kit a layered kit is installed on top of."""

    kit_id: str
    """The base kit's id: the installer checks the base site holds exactly this kit."""
    sglang_version: str
    """The base kit's SGLang release (its default site is ``/tmp/specwatch-site-VERSION``)."""
    wheels: int
    """How many wheels the layered kit leaves to the base (same file, same checksum)."""


class KitManifest(_Model):
    """Everything an install needs to check and reassemble a kit."""

    format: int = 1
    """Manifest format version."""
    kit_id: str
    """sha256 over the wheels' checksums: tells kits apart in a shared staging folder."""
    sglang_version: str
    """The SGLang release."""
    python_version: str
    """The host Python the wheels are for."""
    fa3: bool
    """Whether sglang-kernel keeps its FA3 library."""
    cubin: bool
    """Whether flashinfer-cubin is carried."""
    carries_torch: bool
    """Whether the kit brings its own torch (the host's does not satisfy the release's pin)."""
    part_limit: int
    """Most bytes a part folder holds (payload, install.sh and manifest together)."""
    wheels: list[KitWheel]
    """Every wheel, sorted by name."""
    parts: list[KitPart]
    """Every part, in order."""
    host_served: dict[str, str]
    """Requirements left to the host's own distributions: name -> requirement."""
    omitted: dict[str, str]
    """Requirements left out by a release rule: name -> why."""
    base: Optional[KitBase] = None
    """Set for a layered kit: the kit whose site serves every wheel this one leaves out."""

    @property
    def total_size(self) -> int:
        """Payload bytes over all parts."""
        return sum(p.size for p in self.parts)

    def write(self, path: Path) -> None:
        path.write_text(self.model_dump_json(indent=1) + "\n")

    @classmethod
    def read(cls, path: Path) -> "KitManifest":
        return cls.model_validate_json(path.read_text())
