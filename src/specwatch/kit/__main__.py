"""``python -m specwatch.kit build VERSION --out DIR``: build an offline kit."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specwatch.core.errors import SpecwatchInputError
from specwatch.kit.build import build_kit
from specwatch.kit.download import DEFAULT_CACHE
from specwatch.kit.host import DEFAULT_HOST, HostProfile
from specwatch.kit.pack import DEFAULT_PART_LIMIT, MiB


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="python -m specwatch.kit", description="Offline kits of SGLang releases for air-gapped GPU hosts."
    )
    commands = top.add_subparsers(dest="command", required=True)
    build = commands.add_parser("build", help="download, resolve and pack one SGLang release")
    build.add_argument("version", help="SGLang version, e.g. 0.5.20")
    build.add_argument("--out", type=Path, help="kit folder (default .kit-VERSION)")
    build.add_argument(
        "--host",
        type=Path,
        help="host profile JSON, or the host's `pip list --format=json` (default: Python 3.12, torch 2.11.0+cu130)",
    )
    build.add_argument(
        "--no-fa3", action="store_true", help="leave sglang-kernel's FA3 library out (a layer: as its --base kit did)"
    )
    build.add_argument("--cubin", action="store_true", help="carry flashinfer-cubin")
    build.add_argument(
        "--part-mib",
        type=float,
        default=DEFAULT_PART_LIMIT / MiB,
        help="most MiB per part folder (default %(default)g)",
    )
    build.add_argument(
        "--omit",
        action="append",
        default=[],
        metavar="NAME[=WHY]",
        help="leave a distribution out (repeatable), e.g. one the host's own copy serves",
    )
    build.add_argument(
        "--base",
        type=Path,
        metavar="KIT",
        help="layer on this kit: leave out every wheel it carries (same file), chain its site in env.sh",
    )
    build.add_argument(
        "--with",
        dest="extra",
        action="append",
        default=[],
        metavar="REQ",
        help="carry this requirement too (repeatable), resolved with the release's pins, e.g. ray==2.60.0",
    )
    build.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="wheel cache folder")
    return top


def _omission(text: str) -> tuple[str, str]:
    name, _, why = text.partition("=")
    return name.strip(), why.strip() or "left out when the kit was built (--omit)"


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        host = HostProfile.from_json(args.host) if args.host else DEFAULT_HOST
        out = args.out or Path(f".kit-{args.version}")
        manifest = build_kit(
            args.version,
            out,
            host=host,
            fa3=False if args.no_fa3 else None,
            cubin=args.cubin,
            part_limit=int(args.part_mib * MiB),
            cache=args.cache,
            omit=dict(_omission(o) for o in args.omit),
            base=args.base,
            extra=args.extra,
        )
    except SpecwatchInputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for wheel in manifest.wheels:
        print(f"  {wheel.name}=={wheel.version}  ({wheel.size / MiB:.1f} MiB, from {wheel.required_by})")
    print(f"{len(manifest.parts)} parts, {manifest.total_size / MiB:.1f} MiB in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
