"""Resolving an SGLang release to the exact set of wheels a kit carries.

Starts from the release's own wheel: its ``Requires-Dist`` entries named in
:data:`~specwatch.kit.releases.SERVING_PATH` (and the release's special cases) are followed at
SGLang's pins, then every chosen wheel's own ``Requires-Dist`` in turn (markers evaluated for the
host, extras honoured below the top level), leaving out whatever the host already satisfies.
Versions are picked by pip (the newest wheel that satisfies every requirement seen so far).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from specwatch.core.errors import SpecwatchInputError
from specwatch.kit.download import Downloader
from specwatch.kit.host import HostProfile
from specwatch.kit.releases import SERVING_PATH, rules_for
from specwatch.kit.wheels import Wheel


@dataclass(frozen=True)
class Pin:
    """One distribution the kit carries."""

    wheel: Wheel
    """The wheel file chosen for it."""

    required_by: str
    """What asked for it first (``sglang==0.5.20`` or ``torch==2.13.0``)."""

    requirement: str
    """The requirement it was chosen for (``nvidia-nccl-cu13==2.29.7``)."""

    extras: frozenset[str] = frozenset()
    """Extras its requirers asked for (their dependencies are carried too)."""

    @property
    def name(self) -> str:
        return self.wheel.name

    @property
    def version(self) -> Version:
        return self.wheel.version


@dataclass
class Resolution:
    """The outcome of resolving one release for one host."""

    sglang_version: Version
    """The release."""

    pins: dict[str, Pin] = field(default_factory=dict)
    """What the kit carries, by canonical name."""

    host_served: dict[str, str] = field(default_factory=dict)
    """Requirements the host's own distributions satisfy: name -> the requirement."""

    omitted: dict[str, str] = field(default_factory=dict)
    """Requirements left out by a release rule: name -> why."""

    def sorted_pins(self) -> list[Pin]:
        return [self.pins[n] for n in sorted(self.pins)]


def parse_release(version: str) -> Version:
    """The SGLang version, or a one-line error."""
    try:
        return Version(version)
    except InvalidVersion:
        raise SpecwatchInputError(
            None, f"'{version}' is not a version (expected e.g. 0.5.20)", field="version"
        ) from None


def top_level_requirements(sglang: Wheel, host: HostProfile, *, cubin: bool) -> list[Requirement]:
    """The requirements of the release that the kit follows: SGLang's own pins for the serving
    path and the carried special cases, without their extras."""
    rules = rules_for(sglang.version, cubin=cubin)
    carried = {canonicalize_name(r.name): r for r in rules if r.action == "carry"}
    wanted = SERVING_PATH | set(carried)
    if cubin:
        wanted = wanted | {"flashinfer-cubin"}
    chosen: dict[str, Requirement] = {}
    for req in sglang.requirements_for(host.marker_environment(), set()):
        name = canonicalize_name(req.name)
        if name in wanted:
            chosen[name] = Requirement(f"{name}{req.specifier}")
    for name, rule in carried.items():
        chosen.setdefault(name, Requirement(f"{name}{rule.requirement}"))
    return [chosen[n] for n in sorted(chosen)]


def parse_extra(text: str) -> Requirement:
    """One ``--with`` requirement, e.g. ``ray==2.60.0``."""
    try:
        return Requirement(text)
    except InvalidRequirement:
        raise SpecwatchInputError(
            None, f"'{text}' is not a requirement (expected e.g. ray==2.60.0)", field="--with"
        ) from None


class Resolver:
    """Walks requirements breadth first, one download batch per level."""

    def __init__(
        self,
        downloader: Downloader,
        host: HostProfile,
        *,
        cubin: bool = False,
        omit: dict[str, str] | None = None,
        extra: Sequence[str] = (),
        log: Callable[[str], None] = print,
    ):
        self.downloader = downloader
        self.extra = [parse_extra(r) for r in extra]
        """Requirements carried beside the release's own (``--with``), e.g. ``ray`` for the Ray
        executor; resolved with the release's pins, so they share its wheels."""
        self.extra_omit = {canonicalize_name(k): v for k, v in (omit or {}).items()}
        """Distributions left out at build time (name -> why), beside ``RELEASE_RULES``' omissions."""
        self.host = host
        self.cubin = cubin
        self.log = log
        self.environment = host.marker_environment()
        self.constraints: dict[str, Requirement] = {}

    MAX_ROUNDS = 8
    """Restarts allowed after a conflict (each adds the clashing requirement up front)."""

    def resolve(self, version: str) -> Resolution:
        """Resolve a release; a requirement that rules out a wheel chosen earlier restarts the
        walk with that requirement applied from the start."""
        release = parse_release(version)
        constraints: dict[str, Requirement] = {}
        for _ in range(self.MAX_ROUNDS):
            try:
                return self._resolve_once(release, constraints)
            except _Conflict as clash:
                known = constraints.get(clash.name, clash.chosen_for)
                constraints[clash.name] = merge(known, clash.requirement)
                self.log(f"  {clash}: again with {constraints[clash.name]}")
        raise SpecwatchInputError(
            None,
            f"sglang {release}: requirements still conflict after "
            f"{self.MAX_ROUNDS} rounds ({', '.join(map(str, constraints.values()))})",
        )

    def _resolve_once(self, release: Version, constraints: dict[str, Requirement]) -> Resolution:
        self.constraints = constraints
        sglang = self.downloader.fetch([Requirement(f"sglang=={release}")])["sglang"]
        result = Resolution(release)
        result.pins["sglang"] = Pin(sglang, "the kit", f"sglang=={release}")
        omit = {canonicalize_name(r.name): r.why for r in rules_for(release, cubin=self.cubin) if r.action == "omit"}
        omit.update(self.extra_omit)
        for req in sglang.requirements_for(self.environment, set()):
            if canonicalize_name(req.name) in omit:
                result.omitted[canonicalize_name(req.name)] = omit[canonicalize_name(req.name)]
        pending = [(req, f"sglang=={release}") for req in top_level_requirements(sglang, self.host, cubin=self.cubin)]
        pending += [(req, "--with") for req in self.extra]
        while pending:
            batch, pending = self._next_batch(pending, result, omit)
            pending += self._fetch_batch(batch, result)
        if self.cubin:
            self._add_cubin(result)
        return result

    def _next_batch(self, pending, result: Resolution, omit: dict[str, str]):
        """This level's requirements that need a wheel (merged by name), and the requirements of
        extras asked late of wheels already chosen."""
        batch: dict[str, tuple[Requirement, str]] = {}
        late: list[tuple[Requirement, str]] = []
        for req, by in pending:
            name = canonicalize_name(req.name)
            if name in omit:
                result.omitted[name] = omit[name]
            elif name in result.pins:
                late += self._add_to_chosen(result, result.pins[name], req, by)
            elif self.host.serves(req):
                result.host_served.setdefault(name, f"{name}{req.specifier}")
            elif name in batch:
                batch[name] = (merge(batch[name][0], req), batch[name][1])
            elif name in self.constraints:
                batch[name] = (merge(self.constraints[name], req), by)
            else:
                batch[name] = (req, by)
        return batch, late

    def _add_to_chosen(self, result: Resolution, pin: Pin, req: Requirement, by: str):
        """Check a requirement against the wheel already chosen; extras it adds bring their own
        requirements."""
        if not req.specifier.contains(pin.version, prereleases=True):
            raise _Conflict(pin, req, by)
        new_extras = set(req.extras) - pin.extras
        if not new_extras:
            return []
        result.pins[pin.name] = replace(pin, extras=pin.extras | new_extras)
        before = set(map(str, pin.wheel.requirements_for(self.environment, set(pin.extras))))
        here = f"{pin.name}=={pin.version}"
        return [
            (dep, here) for dep in pin.wheel.requirements_for(self.environment, new_extras) if str(dep) not in before
        ]

    def _fetch_batch(self, batch, result: Resolution):
        """Download the batch; return the next level's requirements."""
        if not batch:
            return []
        wheels = self.downloader.fetch([req for req, _ in batch.values()])
        pending = []
        for name, (req, by) in sorted(batch.items()):
            wheel = wheels[name]
            result.pins[name] = Pin(wheel, by, f"{name}{req.specifier}", frozenset(req.extras))
            here = f"{name}=={wheel.version}"
            pending += [(dep, here) for dep in wheel.requirements_for(self.environment, set(req.extras))]
        return pending

    def _add_cubin(self, result: Resolution) -> None:
        """flashinfer-cubin at flashinfer's version, where SGLang did not pin it."""
        flashinfer = result.pins.get("flashinfer-python")
        if flashinfer is None or "flashinfer-cubin" in result.pins:
            return
        req = Requirement(f"flashinfer-cubin=={flashinfer.version}")
        wheel = self.downloader.fetch([req])["flashinfer-cubin"]
        result.pins["flashinfer-cubin"] = Pin(wheel, "cubin=True", str(req))


class _Conflict(Exception):
    """A requirement that the wheel chosen earlier does not satisfy."""

    def __init__(self, pin: Pin, requirement: Requirement, by: str):
        self.name = pin.name
        self.requirement = Requirement(f"{pin.name}{requirement.specifier}")
        self.chosen_for = Requirement(pin.requirement)
        super().__init__(f"{by} requires {requirement}, but {pin.name} {pin.version} was chosen for {pin.required_by}")


def merge(a: Requirement, b: Requirement) -> Requirement:
    """One requirement that asks for both (specifiers intersected, extras united)."""
    merged = Requirement(a.name)
    merged.specifier = a.specifier & b.specifier
    merged.extras = set(a.extras) | set(b.extras)
    return merged
