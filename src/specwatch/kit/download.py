"""Fetching wheels: ``pip download --no-deps`` for the host's Python and platform, with a cache.

The resolver asks for a batch of requirements and gets one wheel per requirement back. Anything
with the same interface (:class:`Downloader`) can stand in, e.g. a pip pointed at a local folder
(``index_args=("--no-index", "--find-links", DIR)``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol, Sequence

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from specwatch.core.errors import SpecwatchInputError
from specwatch.kit.host import HostProfile
from specwatch.kit.wheels import Wheel

DEFAULT_CACHE = Path(os.environ.get("SPECWATCH_KIT_CACHE", Path.home() / ".cache" / "specwatch-kit"))
"""Where downloaded wheels are kept between builds (``$SPECWATCH_KIT_CACHE``)."""

NETWORK_FAILURE = re.compile(
    r"NewConnectionError|Network is unreachable|Temporary failure in name resolution|"
    r"Name or service not known|ConnectTimeout|ProxyError|Connection refused|"
    r"Max retries exceeded|Read timed out"
)
"""pip output that means the index could not be reached."""

NO_MATCH = re.compile(r"No matching distribution found for (\S+)")


class Downloader(Protocol):
    """Fetches one wheel per requirement (no dependencies) for the kit's host."""

    def fetch(self, requirements: Sequence[Requirement]) -> dict[str, Wheel]:
        """Wheels by canonical name, one for each requirement."""
        ...


def pinned_spec(requirement: Requirement) -> str:
    """``name<specifier>``: what pip is asked for (extras and markers are the resolver's business)."""
    return f"{requirement.name}{requirement.specifier}"


@dataclass
class PipDownloader:
    """``pip download --no-deps --only-binary=:all:`` for the host's Python and platforms."""

    host: HostProfile
    """The host whose Python and platform the wheels are for."""

    cache: Path = DEFAULT_CACHE
    """Wheels land in ``cache/wheels``; an exact pin found there is not downloaded again."""

    index_args: tuple[str, ...] = ()
    """Extra pip options naming where wheels come from (``--no-index --find-links DIR``)."""

    python: str = sys.executable
    """The interpreter whose pip runs."""

    log: Callable[[str], None] = print
    """Where progress lines go."""

    @property
    def wheel_dir(self) -> Path:
        return self.cache / "wheels"

    def fetch(self, requirements: Sequence[Requirement]) -> dict[str, Wheel]:
        found: dict[str, Wheel] = {}
        wanted = []
        for req in requirements:
            cached = self._cached(req)
            if cached is not None:
                found[cached.name] = cached
            else:
                wanted.append(req)
        if wanted:
            found.update(self._download(wanted))
        missing = [r.name for r in requirements if canonicalize_name(r.name) not in found]
        if missing:
            raise SpecwatchInputError(None, f"pip gave no wheel for {', '.join(missing)}")
        return found

    def _cached(self, req: Requirement) -> Wheel | None:
        """A cached wheel for an exact pin (``==X``, no wildcard), best tag first."""
        pins = [s for s in req.specifier if s.operator == "==" and not s.version.endswith(".*")]
        if not pins or not self.wheel_dir.is_dir():
            return None
        rank = {tag: i for i, tag in enumerate(self.host.supported_tags())}
        name = canonicalize_name(req.name)
        best: tuple[int, Wheel] | None = None
        for path in self.wheel_dir.glob("*.whl"):
            wheel = Wheel(path)
            try:
                if wheel.name != name or not req.specifier.contains(wheel.version, prereleases=True):
                    continue
            except SpecwatchInputError:
                continue
            score = min((rank[t] for t in wheel.tags if t in rank), default=None)
            if score is not None and (best is None or score < best[0]):
                best = (score, wheel)
        return best[1] if best else None

    def pip_command(self, specs: Sequence[str], dest: Path) -> list[str]:
        """The ``pip download`` command line for ``specs`` into ``dest``."""
        platforms = [a for p in self.host.platforms for a in ("--platform", p)]
        return [
            self.python,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--disable-pip-version-check",
            "--progress-bar",
            "off",
            "--retries",
            "2",
            "--python-version",
            self.host.python_version,
            "--implementation",
            "cp",
            *platforms,
            "--platform",
            "any",
            *self.index_args,
            "-d",
            str(dest),
            *specs,
        ]

    def _download(self, requirements: Sequence[Requirement]) -> dict[str, Wheel]:
        specs = [pinned_spec(r) for r in requirements]
        self.log(f"  downloading {len(specs)}: {' '.join(specs)}")
        self.wheel_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=self.cache, prefix="dl-") as tmp:
            run = subprocess.run(self.pip_command(specs, Path(tmp)), capture_output=True, text=True)
            if run.returncode != 0:
                raise download_error(run.stdout + run.stderr, specs)
            got: dict[str, Wheel] = {}
            for path in Path(tmp).glob("*.whl"):
                target = self.wheel_dir / path.name
                shutil.move(str(path), target)
                got[Wheel(target).name] = Wheel(target)
            return got


def download_error(output: str, specs: Sequence[str]) -> SpecwatchInputError:
    """One line saying why pip failed: no network, or no wheel for a requirement."""
    if NETWORK_FAILURE.search(output):
        return SpecwatchInputError(
            None, f"cannot reach the package index (no network?) while downloading {', '.join(specs)}"
        )
    missing = NO_MATCH.search(output)
    if missing:
        return SpecwatchInputError(
            None, f"no wheel of {missing.group(1)} for this host (CPython, manylinux x86_64) on the package index"
        )
    last = [line for line in output.splitlines() if line.strip() and "WARNING" not in line]
    return SpecwatchInputError(None, f"pip download failed: {last[-1] if last else 'no output'}")
