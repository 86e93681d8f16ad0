"""``build_kit``: an SGLang release and what the host lacks for it, packed into parts."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from typing import Callable, Sequence

from specwatch.core.errors import SpecwatchInputError
from specwatch.kit import pack
from specwatch.kit.download import DEFAULT_CACHE, Downloader, PipDownloader
from specwatch.kit.host import DEFAULT_HOST, HostProfile
from specwatch.kit.installer import INSTALL_SH, write_installer
from specwatch.kit.manifest import MANIFEST_NAME, KitBase, KitFile, KitManifest, KitPart, KitWheel
from specwatch.kit.pins import Pin, Resolution, Resolver
from specwatch.kit.trim import without_fa3


def build_kit(
    version: str,
    out: Path,
    *,
    host: HostProfile = DEFAULT_HOST,
    fa3: bool | None = None,
    cubin: bool = False,
    part_limit: int = pack.DEFAULT_PART_LIMIT,
    cache: Path = DEFAULT_CACHE,
    downloader: Downloader | None = None,
    omit: dict[str, str] | None = None,
    base: Path | None = None,
    extra: Sequence[str] = (),
    log: Callable[[str], None] = print,
) -> KitManifest:
    """Build the offline kit for SGLang ``version`` in ``out`` (``out/part-NN/``).

    ``fa3=False`` leaves sglang-kernel's FA3 library out (default: as the base kit did, else kept);
    ``cubin=True`` carries flashinfer-cubin.
    ``omit``: distributions to leave out (name -> why), e.g. a library the host's own copy serves.
    ``base``: a kit folder (or its manifest) this kit is layered on: every wheel the base carries
    as the same file with the same checksum is left to the base's site, e.g. one torch layer
    shared by several SGLang releases; what the base omitted is omitted here too.
    ``extra``: requirements carried beside the release's (e.g. ``ray`` for the Ray executor),
    resolved together with its pins.
    ``downloader`` replaces pip against the package index (tests use a local folder).
    Raises :class:`~specwatch.core.errors.SpecwatchInputError` (one line) on bad input or no network.
    """
    out = Path(out)
    check_out_dir(out)
    base_manifest = read_base(base) if base is not None else None
    omit, fa3 = as_base(base_manifest, omit, fa3)
    downloader = downloader or PipDownloader(host, cache, log=log)
    log(f"== resolving sglang {version} for Python {host.python_version}")
    resolution = Resolver(downloader, host, cubin=cubin, omit=omit, extra=extra, log=log).resolve(version)
    pins = resolution.sorted_pins()
    if not fa3:
        pins = [drop_fa3(p, cache) for p in pins]
    layer = None
    if base_manifest is not None:
        pins, layer = layered_on(base_manifest, pins)
        log(f"== layered on the sglang {layer.sglang_version} kit: {layer.wheels} wheels left to its site")
    log(f"== packing {len(pins)} wheels into parts of at most {part_limit / pack.MiB:g} MiB")
    manifest = write_parts(
        resolution,
        pins,
        out,
        fa3=fa3,
        cubin=cubin,
        part_limit=part_limit,
        python_version=host.python_version,
        base=layer,
    )
    log(f"== kit in {out}: {len(manifest.parts)} parts, {manifest.total_size / pack.MiB:.1f} MiB")
    return manifest


def check_out_dir(out: Path) -> None:
    """``out`` must be absent, empty, or hold an earlier kit (whose parts are replaced)."""
    if out.exists() and not out.is_dir():
        raise SpecwatchInputError(out, "exists and is not a folder")
    if out.is_dir():
        foreign = [p.name for p in out.iterdir() if not (p.name.startswith("part-") or p.name == MANIFEST_NAME)]
        if foreign:
            raise SpecwatchInputError(out, f"folder is not empty and holds no kit ({foreign[0]}, ...)")


def read_base(path: Path) -> KitManifest:
    """The manifest of the kit at ``path`` (its folder or its manifest file)."""
    path = Path(path)
    manifest = path / MANIFEST_NAME if path.is_dir() else path
    if not manifest.is_file():
        raise SpecwatchInputError(path, "no kit manifest here", field="--base")
    try:
        return KitManifest.read(manifest)
    except ValueError as e:
        raise SpecwatchInputError(manifest, f"not a kit manifest ({str(e).splitlines()[0]})", field="--base") from None


def layered_on(base: KitManifest, pins: list[Pin]) -> tuple[list[Pin], KitBase]:
    """The pins the base kit does not carry as the same file, and the layer's record of its base."""
    served = {w.filename: w.sha256 for w in base.wheels}
    # hashed here only where the base has the file name: a wheel the layer keeps is hashed once, later
    kept = [p for p in pins if p.wheel.path.name not in served or served[p.wheel.path.name] != p.wheel.sha256()]
    if not kept:
        raise SpecwatchInputError(
            None, f"the base kit (sglang {base.sglang_version}) already carries every wheel", field="--base"
        )
    return kept, KitBase(kit_id=base.kit_id, sglang_version=base.sglang_version, wheels=len(pins) - len(kept))


def as_base(base: KitManifest | None, omit: dict[str, str] | None, fa3: bool | None) -> tuple[dict, bool]:
    """(omit, fa3) of a kit on ``base``: what the base left out is left out too (a layer on a kit
    that left cuDNN to the host would otherwise carry the newest cuDNN, over 500 MiB, on top of
    it), and FA3 as the base had it unless given (a layer on a kit without FA3 would otherwise carry
    the whole sglang-kernel wheel again, about 355 MiB for 0.5.23: the base's trimmed copy is
    another file)."""
    if base is None:
        return dict(omit or {}), True if fa3 is None else fa3
    return {**base.omitted, **(omit or {})}, base.fa3 if fa3 is None else fa3


def drop_fa3(pin: Pin, cache: Path) -> Pin:
    if pin.name != "sglang-kernel":
        return pin
    return Pin(without_fa3(pin.wheel, cache / "no-fa3"), pin.required_by, pin.requirement, pin.extras)


def write_parts(
    resolution: Resolution,
    pins: list[Pin],
    out: Path,
    *,
    fa3: bool,
    cubin: bool,
    part_limit: int,
    python_version: str,
    base: KitBase | None = None,
) -> KitManifest:
    """Cut, lay out and checksum the parts; write the manifest and installer into each."""
    payload_limit = payload_limit_for(pins, part_limit)
    pieces = [piece for pin in pins for piece in pack.pieces_of(pin.wheel.path, payload_limit)]
    groups = pack.plan_parts(pieces, payload_limit)
    for old in out.glob("part-*"):
        shutil.rmtree(old)
    out.mkdir(parents=True, exist_ok=True)
    parts = []
    for index, group in enumerate(groups):
        folder = out / pack.part_name(index)
        folder.mkdir()
        files = [pack.write_piece(piece, folder) for piece in group]
        parts.append(
            KitPart(
                name=folder.name,
                files=[KitFile(**pack.file_entry(f)) for f in files],
                size=sum(f.stat().st_size for f in files),
                sha256=pack.part_digest(files),
            )
        )
    wheels = [kit_wheel(pin, [p.name for p in pieces if p.source == pin.wheel.path]) for pin in pins]
    manifest = KitManifest(
        kit_id=hashlib.sha256(("".join(w.sha256 for w in wheels) + (base.kit_id if base else "")).encode()).hexdigest(),
        sglang_version=str(resolution.sglang_version),
        python_version=python_version,
        fa3=fa3,
        cubin=cubin,
        carries_torch=any(w.name == "torch" for w in wheels),
        part_limit=part_limit,
        wheels=wheels,
        parts=parts,
        host_served=dict(sorted(resolution.host_served.items())),
        omitted=dict(sorted(resolution.omitted.items())),
        base=base,
    )
    manifest.write(out / MANIFEST_NAME)
    for part in parts:
        folder = out / part.name
        manifest.write(folder / MANIFEST_NAME)
        write_installer(folder)
        total = sum(f.stat().st_size for f in folder.iterdir())
        if total > part_limit:
            raise SpecwatchInputError(folder, f"part holds {total} bytes, over the {part_limit} limit")
    return manifest


def payload_limit_for(pins: list[Pin], part_limit: int) -> int:
    """Bytes of wheels per part, once install.sh and the manifest have their room."""
    total = sum(p.wheel.path.stat().st_size for p in pins)
    rough_pieces = len(pins) + total // max(part_limit // 2, 1) + 1
    payload = part_limit - pack.overhead_estimate(len(INSTALL_SH.encode()), len(pins), rough_pieces)
    if payload < part_limit // 4:
        raise SpecwatchInputError(
            None,
            f"a part of {part_limit} bytes leaves too little room for wheels beside install.sh and the manifest",
            field="part_limit",
        )
    return payload


def kit_wheel(pin: Pin, chunks: list[str]) -> KitWheel:
    path = pin.wheel.path
    return KitWheel(
        name=pin.name,
        version=str(pin.version),
        filename=path.name,
        sha256=pin.wheel.sha256(),
        size=path.stat().st_size,
        requirement=pin.requirement,
        required_by=pin.required_by,
        chunks=chunks,
    )
