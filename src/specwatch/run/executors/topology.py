"""A host's GPUs and their NVLink islands, read from ``nvidia-smi -L`` and ``nvidia-smi topo -m``.

An island is a set of GPUs joined by NVLink (``NV#`` entries of the topology matrix, followed
transitively). A tp > 1 engine group is placed inside one island, so its ranks talk over NVLink. On a
host whose matrix has no NVLink at all every GPU pair talks over PCIe, and the host is one island.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from typing import Callable, Optional

from specwatch.core.errors import SpecwatchInputError

ANSI = re.compile(r"\x1b\[[0-9;]*m")
"""Terminal escapes ``nvidia-smi topo -m`` puts around its header cells."""


def smi(args: list[str]) -> Optional[str]:
    """``nvidia-smi ARGS``' output; None where it cannot run or fails."""
    try:
        out = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def parse_gpu_list(text: str) -> list[str]:
    """GPU indexes of ``nvidia-smi -L`` (``GPU 0: NVIDIA H200 (UUID: ...)``), in its order."""
    return re.findall(r"^GPU (\d+):", text, flags=re.M)


def parse_topology(text: str) -> dict[tuple[str, str], str]:
    """``nvidia-smi topo -m``'s GPU-to-GPU entries: (GPU a, GPU b) -> link (``X``, ``NV18``, ``SYS``,
    ``PIX``, ...), GPUs by index. NIC rows and the affinity columns are left out."""
    lines = [ANSI.sub("", raw) for raw in text.splitlines()]
    header = next((ln for ln in lines if re.match(r"^\s+GPU0\b", ln)), None)
    if header is None:
        return {}
    columns = [c[3:] for c in re.findall(r"GPU\d+", header)]
    links = {}
    for ln in lines:
        m = re.match(r"^GPU(\d+)\s+(.*)$", ln)
        if not m:
            continue
        cells = m.group(2).split()
        for col, cell in zip(columns, cells):
            links[(m.group(1), col)] = cell
    return links


def islands(gpus: list[str], links: dict[tuple[str, str], str]) -> list[list[str]]:
    """``gpus`` split into NVLink islands (connected through ``NV#`` links, in ``gpus`` order); one
    island of all of them when the matrix has no NVLink (or no matrix was read)."""
    if not any(v.startswith("NV") for v in links.values()):
        return [list(gpus)] if gpus else []
    root = {g: g for g in gpus}

    def find(g: str) -> str:
        while root[g] != g:
            g = root[g]
        return g

    for (a, b), link in links.items():
        if a in root and b in root and link.startswith("NV"):
            root[find(a)] = find(b)
    out: dict[str, list[str]] = {}
    for g in gpus:
        out.setdefault(find(g), []).append(g)
    return list(out.values())


@dataclass(frozen=True)
class Topology:
    """The GPUs a run may use and their islands."""

    gpus: list[str]
    """GPU ids as ``CUDA_VISIBLE_DEVICES`` names them (nvidia-smi's indexes, PCI bus order)."""
    islands: list[list[str]]
    """``gpus`` split into NVLink islands."""
    source: str
    """Where the GPU list came from (``nvidia-smi -L``, ``CUDA_VISIBLE_DEVICES``)."""

    @property
    def widest(self) -> int:
        """GPUs of the largest island: the widest tp a group can be given."""
        return max((len(i) for i in self.islands), default=0)

    def describe(self) -> str:
        return " ".join("[" + ",".join(i) + "]" for i in self.islands)


def discover(wanted: Optional[tuple[str, ...]] = None, run_smi: Callable[[list[str]], Optional[str]] = smi) -> Topology:
    """This host's GPUs (``nvidia-smi -L``, narrowed to ``CUDA_VISIBLE_DEVICES`` when that is set),
    narrowed to ``wanted`` (``--gpus``), and their islands (``nvidia-smi topo -m``). A wanted GPU the
    host does not have, or no GPU at all, is a ``SpecwatchInputError`` naming ``--gpus``."""
    listed = parse_gpu_list(run_smi(["-L"]) or "")
    source = "nvidia-smi -L"
    visible = [g.strip() for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g.strip()]
    if visible:
        if not listed or not all(g.isdigit() for g in visible):
            listed, source = visible, "CUDA_VISIBLE_DEVICES"
        else:
            listed, source = [g for g in visible if g in listed], "nvidia-smi -L and CUDA_VISIBLE_DEVICES"
    if not listed:
        raise SpecwatchInputError(
            None, "--executor gpus: no GPU found (nvidia-smi -L lists none, CUDA_VISIBLE_DEVICES unset)"
        )
    if wanted:
        missing = [g for g in wanted if g not in listed]
        if missing:
            raise SpecwatchInputError(
                None,
                f"GPU {','.join(missing)} is not on this host (it has {','.join(listed)}, from {source})",
                field="--gpus",
            )
        if len(set(wanted)) != len(wanted):
            raise SpecwatchInputError(None, f"{','.join(wanted)} names a GPU twice", field="--gpus")
        listed = list(wanted)
    links = parse_topology(run_smi(["topo", "-m"]) or "") if source != "CUDA_VISIBLE_DEVICES" else {}
    return Topology(gpus=listed, islands=islands(listed, links), source=source)
