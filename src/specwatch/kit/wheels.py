"""A downloaded wheel: its name, version and the requirements its METADATA declares."""

from __future__ import annotations

import hashlib
import zipfile
from dataclasses import dataclass
from email.parser import HeaderParser
from functools import cached_property
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.tags import Tag
from packaging.utils import InvalidWheelFilename, NormalizedName, parse_wheel_filename
from packaging.version import Version

from specwatch.core.errors import SpecwatchInputError


@dataclass(frozen=True)
class Wheel:
    """A wheel file on disk."""

    path: Path
    """Where the file lies."""

    @cached_property
    def _parsed(self) -> tuple[NormalizedName, Version, tuple, frozenset[Tag]]:
        try:
            return parse_wheel_filename(self.path.name)
        except InvalidWheelFilename as e:
            raise SpecwatchInputError(self.path, f"not a wheel file name: {e}") from None

    @property
    def name(self) -> NormalizedName:
        """Canonical distribution name (``flashinfer-python``)."""
        return self._parsed[0]

    @property
    def version(self) -> Version:
        """The wheel's version."""
        return self._parsed[1]

    @property
    def tags(self) -> frozenset[Tag]:
        """The tags its file name declares."""
        return self._parsed[3]

    @cached_property
    def metadata(self):
        """The parsed ``*.dist-info/METADATA`` headers."""
        try:
            with zipfile.ZipFile(self.path) as z:
                names = [n for n in z.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
                if not names:
                    raise SpecwatchInputError(self.path, "wheel has no .dist-info/METADATA")
                text = z.read(names[0]).decode("utf-8")
        except (OSError, zipfile.BadZipFile) as e:
            raise SpecwatchInputError(self.path, f"cannot read wheel: {e}") from None
        return HeaderParser().parsestr(text)

    @cached_property
    def requires_dist(self) -> list[Requirement]:
        """Its ``Requires-Dist`` entries, markers kept."""
        out = []
        for line in self.metadata.get_all("Requires-Dist") or []:
            try:
                out.append(Requirement(line))
            except InvalidRequirement as e:
                raise SpecwatchInputError(self.path, f"bad Requires-Dist {line!r}: {e}") from None
        return out

    def requirements_for(self, environment: dict[str, str], extras: set[str]) -> list[Requirement]:
        """The requirements that apply on a host with ``environment`` when installed with ``extras``."""
        chosen = []
        for req in self.requires_dist:
            if req.marker is None:
                chosen.append(req)
            elif any(req.marker.evaluate({**environment, "extra": e}) for e in ({""} | extras)):
                chosen.append(req)
        return chosen

    def sha256(self) -> str:
        """Hex sha256 of the file."""
        return file_sha256(self.path)


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
