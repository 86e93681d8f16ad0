"""The target GPU host: its Python, its wheel platform, and the distributions it already has.

A kit carries a distribution only where the host lacks it or has a version that does not satisfy
the requirement (torch 2.13.0 for a host with torch 2.11.0 is carried, with the NCCL, cuDNN and
triton wheels its METADATA pins; a host torch that satisfies the pin is used as it is).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from packaging.requirements import Requirement
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import canonicalize_name
from packaging.version import Version

from specwatch.core.errors import SpecwatchInputError

MANYLINUX_X86_64 = (
    *(f"manylinux_2_{minor}_x86_64" for minor in range(34, 16, -1)),
    "manylinux2014_x86_64",
    "manylinux2010_x86_64",
    "manylinux1_x86_64",
)
"""Wheel platforms a glibc-2.34 x86_64 host runs, newest first, each named (pip does not widen a
``--platform`` to older glibc versions): SGLang's own wheels are manylinux_2_34, torch's
manylinux_2_28, NCCL's manylinux_2_18, sglang-kernel's manylinux2014."""

TORCH_2_11_CU130 = {
    "torch": "2.11.0+cu130",
    "triton": "3.6.0",
    "nvidia-nccl-cu13": "2.28.9",
    "nvidia-cudnn-cu13": "9.19.0.56",
    "nvidia-cusparselt-cu13": "0.8.0",
    "nvidia-nvshmem-cu13": "3.4.5",
    "cuda-toolkit": "13.0.2",
    # cuda-toolkit 13.0.2's components for torch's extras (its METADATA pins them as X.*)
    "nvidia-cublas": "13.1.0.3",
    "nvidia-cuda-runtime": "13.0.96",
    "nvidia-cufft": "12.0.0.61",
    "nvidia-cufile": "1.15.1.6",
    "nvidia-cuda-cupti": "13.0.85",
    "nvidia-curand": "10.4.0.35",
    "nvidia-cusolver": "12.0.4.66",
    "nvidia-cusparse": "12.6.3.3",
    "nvidia-nvjitlink": "13.0.88",
    "nvidia-cuda-nvrtc": "13.0.88",
    "nvidia-nvtx": "13.0.85",
}
"""torch 2.11.0+cu130 and what its METADATA pins (triton, NCCL, cuDNN, the CUDA 13.0.2 libraries)."""

HOST_IMAGE_PACKAGES: dict[str, str | None] = {
    # torch's pure-Python dependencies
    "filelock": None,
    "sympy": None,
    "mpmath": None,
    "networkx": None,
    "jinja2": None,
    "markupsafe": None,
    "fsspec": None,
    "setuptools": None,
    # scientific and HTTP basics of the image
    "numpy": None,
    "scipy": None,
    "pandas": None,
    "pillow": None,
    "packaging": None,
    "requests": None,
    "urllib3": None,
    "certifi": None,
    "idna": None,
    "charset-normalizer": None,
    "httpx": None,
    "httpcore": None,
    "anyio": None,
    "h11": None,
    "click": None,
    "typer": None,
    "rich": None,
    "pygments": None,
    "tqdm": None,
    "pyyaml": None,
    "psutil": None,
    "six": None,
    "python-dateutil": None,
    "pytz": None,
    "tzdata": None,
    # transformers 5.17's own dependencies (the image's transformers is too new for SGLang's pins,
    # but what it needs is there)
    "transformers": "5.17.0",
    "huggingface-hub": None,
    "hf-xet": None,
    "safetensors": None,
    "regex": None,
    # what SGLang's HTTP server imports at start that the image has (the image's package list):
    # aiohttp, uvloop and sentencepiece, and torchvision 0.26.0, built for the image's torch 2.11
    # (SGLang imports torchvision.io at module level; docs/offline-kit.md says what a kit that
    # carries its own torch does about it)
    "aiohttp": None,
    "uvloop": None,
    "sentencepiece": None,
    "torchvision": "0.26.0",
}
"""Distributions of the default host image besides torch. ``None``: present, version unknown;
such an entry serves a range (``>=``, ``<``, none) but never an exact pin (``==``): exact pins
are carried."""


def _default_installed() -> dict[str, str | None]:
    return {**TORCH_2_11_CU130, **HOST_IMAGE_PACKAGES}


@dataclass(frozen=True)
class HostProfile:
    """The host a kit is built for."""

    python_version: str = "3.12"
    """Interpreter version ``major.minor``: wheels are chosen for CPython of this version."""

    python_full_version: str = "3.12.3"
    """Full interpreter version, for environment markers (``python_full_version``)."""

    platforms: tuple[str, ...] = MANYLINUX_X86_64
    """Wheel platform tags the host runs, most specific first (``--platform`` for pip)."""

    installed: Mapping[str, str | None] = field(default_factory=_default_installed)
    """Distributions already on the host: name -> version (``None``: version unknown)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "installed", {canonicalize_name(k): v for k, v in self.installed.items()})

    @property
    def python_tuple(self) -> tuple[int, int]:
        """``(3, 12)`` for ``"3.12"``."""
        major, minor = self.python_version.split(".")[:2]
        return int(major), int(minor)

    def marker_environment(self) -> dict[str, str]:
        """The values PEP 508 markers are evaluated with on this host."""
        return {
            "python_version": self.python_version,
            "python_full_version": self.python_full_version,
            "implementation_name": "cpython",
            "implementation_version": self.python_full_version,
            "platform_python_implementation": "CPython",
            "platform_system": "Linux",
            "platform_machine": "x86_64",
            "sys_platform": "linux",
            "os_name": "posix",
            "platform_release": "",
            "platform_version": "",
        }

    def supported_tags(self) -> list[Tag]:
        """Wheel tags the host installs, best first (what pip would accept there)."""
        py = self.python_tuple
        abi = f"cp{py[0]}{py[1]}"
        return [
            *cpython_tags(py, abis=[abi, "abi3", "none"], platforms=self.platforms),
            *compatible_tags(py, interpreter=abi, platforms=self.platforms),
        ]

    def serves(self, requirement: Requirement) -> bool:
        """Whether the host's own distribution satisfies ``requirement`` (so the kit leaves it out)."""
        name = canonicalize_name(requirement.name)
        if name not in self.installed:
            return False
        version = self.installed[name]
        if version is None:
            return not any(s.operator in ("==", "===") for s in requirement.specifier)
        return requirement.specifier.contains(Version(version), prereleases=True)

    @classmethod
    def from_json(cls, path: Path) -> "HostProfile":
        """A profile from a JSON file: either an object with the fields above (``installed``
        replaces the default's), or the host's ``python3 -m pip list --format=json`` (a list of
        ``{"name", "version"}``: the default profile with exactly those distributions)."""
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as e:
            raise SpecwatchInputError(path, f"cannot read host profile: {e}") from None
        if isinstance(data, list):
            try:
                return cls(installed={d["name"]: d["version"] for d in data})
            except (KeyError, TypeError):
                raise SpecwatchInputError(path, "a pip list must hold {name, version} objects") from None
        if not isinstance(data, dict):
            raise SpecwatchInputError(path, "host profile must be a JSON object or a pip list")
        unknown = set(data) - {"python_version", "python_full_version", "platforms", "installed"}
        if unknown:
            raise SpecwatchInputError(path, f"unknown field(s) {sorted(unknown)}")
        if "platforms" in data:
            data["platforms"] = tuple(data["platforms"])
        return cls(**data)


DEFAULT_HOST = HostProfile()
"""Python 3.12, x86_64 glibc 2.34, torch 2.11.0+cu130 (triton 3.6.0, NCCL 2.28.9, cuDNN 9.19) and the
packages of :data:`HOST_IMAGE_PACKAGES`."""
