"""The dashboard's parts (its tables, figures and markdown pages) kept in the results store between
builds (``store.result_cache.cached_value``, ``RESULTS/.cache/dashboard/NAME.pkl``).

A part is taken from the store while every input file of the store (``store_inputs``: the
records, the run summaries, the noise budgets; not the caches) has the stamp it had when the
records the part was computed from were read, no file was added or removed, and the package and
its libraries are the same (``result_cache.code_key``), as is what it reads besides the store
(the health matrix: the suite files' plans, ``value``'s ``reads``); otherwise it is computed again
and kept.
A part that reads only some of the records (the DCP tables: the DCP suites') is kept under those
records themselves instead (``rows_value``). A part whose reads are cheap to find beside its cost
(the figures, ``figure_reads``; the health matrix, the findings, the fault, overhead, roofline and
timing tables, the release verdict) is kept under the stamps and, where they moved, under what it
reads of the records (``read_kept``, ``kept``). A figure is kept as the bytes of the files it wrote, and
written again from them. ``NO_CACHE`` computes every part (a frame that is not a store's).
"""

from __future__ import annotations

import hashlib
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional, TypeVar

from specwatch.store.frame_cache import SUFFIX as ROWS_SUFFIX
from specwatch.store.result_cache import cached_value, code_key, file_stamps

if TYPE_CHECKING:
    import pandas as pd

T = TypeVar("T")
R = TypeVar("R")

READS_SUFFIX = ".reads"
"""The name ending of a part kept under what it reads (``PartCache.read_kept``)."""

PART_DIR = "dashboard"
"""The folder under the store's cache folder that holds the parts."""


def store_inputs(root: Path) -> list[Path]:
    """Every file under the results root that a part may read: all but those under a folder or of
    a name that starts with '.' (the caches, temporary files) and the Parquet caches beside the
    JSONL (``frame_cache``, ``picks_cache``)."""
    root = Path(root)
    return sorted(
        p
        for p in root.rglob("*")
        if not any(part.startswith(".") for part in p.relative_to(root).parts)
        and not p.name.endswith(ROWS_SUFFIX)
        and p.is_file()
    )


@dataclass
class PartCache:
    """The parts of one store's dashboard: ``value`` and ``files`` compute a part or take it from
    the store (``root`` None: always computed). Made before the records are read (``of``): a part
    is kept under the inputs' stamps as they were then (a file written since has another)."""

    root: Optional[Path] = None
    """The results root the parts are computed from and kept in; None: nothing is kept."""
    stamps: Optional[list[list]] = None
    """``result_cache.file_stamps`` of the store's inputs (``store_inputs``) before the records
    were read (None: one could not be read; then nothing is kept)."""

    @classmethod
    def of(cls, root: Path) -> "PartCache":
        """The parts of the store at ``root``; call it before reading the records."""
        return cls(Path(root), file_stamps(store_inputs(root)))

    def value(
        self, name: str, compute: Callable[[], T], reads: Optional[dict[str, Optional["pd.DataFrame"]]] = None
    ) -> T:
        """``compute()``, or the value it gave while the inputs and the code were as now; ``reads``:
        the frames it reads besides the store (the suite files' planned cells), by name, kept
        under their ``reads_digest``."""
        if self.root is None or self.stamps is None:
            return compute()
        key = {"part": name, "files": self.stamps, "code": code_key()}
        if reads is not None:
            key["reads"] = reads_digest(reads)
        return cached_value(self.root, f"{PART_DIR}/{name}", key, compute)

    def rows_value(self, name: str, rows: "pd.DataFrame", compute: Callable[["pd.DataFrame"], T]) -> T:
        """``compute(rows)`` (``rows`` renumbered from 0), or the value it gave for the same rows
        (``rows_digest``) under today's code, whatever the store's other records: a part that reads
        a few suites' records is kept across writes to the others' files."""
        rows = rows.reset_index(drop=True)
        return self.read_value(name, rows, lambda: compute(rows))

    def read_value(self, name: str, reads: object, compute: Callable[[], T]) -> T:
        """``compute()``, or the value it gave for the same ``reads`` (what it reads of the records:
        frames, and the values found from them; ``reads_digest``) under today's code, whatever the
        store's other records."""
        if self.root is None:
            return compute()
        key = {"part": name, "reads": reads_digest(reads), "code": code_key()}
        return cached_value(self.root, f"{PART_DIR}/{name}", key, compute)

    def read_kept(
        self,
        name: str,
        reads: Callable[[], object],
        compute: Callable[[], T],
        also: Optional[dict[str, Optional["pd.DataFrame"]]] = None,
    ) -> T:
        """``compute()`` kept under the inputs' stamps and ``also`` (``value``'s ``reads``: an
        unchanged store finds no reads) and, where they changed, under ``reads()`` (``read_value``,
        as ``NAME.reads``; ``reads()`` holds what ``also`` does): a write to records the part does
        not read leaves it kept."""
        if self.root is None or self.stamps is None:
            return compute()
        return self.value(name, lambda: self.read_value(f"{name}{READS_SUFFIX}", reads(), compute), reads=also)

    def kept(
        self,
        name: str,
        reads: Callable[[], R],
        compute: Callable[[R], T],
        also: Optional[dict[str, Optional["pd.DataFrame"]]] = None,
    ) -> T:
        """``compute(reads())``, kept as ``read_kept`` keeps it: what the part reads of the records
        found once, and the part computed from that alone."""
        found: list = []

        def read() -> R:
            found.append(reads())
            return found[-1]

        return self.read_kept(name, read, lambda: compute(found[-1] if found else reads()), also)

    def files(
        self, name: str, folder: Path, draw: Callable[[Path], list[Path]], reads: Optional[Callable[[], object]] = None
    ) -> list[Path]:
        """The files ``draw(folder)`` writes into ``folder`` (returned, in its order), written from
        the bytes kept of them where the part is fresh: under the store's stamps, or where ``reads``
        is given, under what it returns too (all the part reads of the records, ``read_kept``)."""
        if self.root is None or self.stamps is None:
            return draw(folder)

        def drawn() -> list[tuple[str, bytes]]:
            return [(p.name, p.read_bytes()) for p in draw(folder)]

        kept = self.value(name, drawn) if reads is None else self.read_kept(name, reads, drawn)
        if kept:
            folder.mkdir(parents=True, exist_ok=True)
        for file_name, data in kept:
            (folder / file_name).write_bytes(data)
        return [folder / file_name for file_name, _ in kept]


def rows_digest(rows: "pd.DataFrame") -> str:
    """sha256 over a frame's length, its columns' names and dtypes and their values: a typed
    column's bytes, a datetime column's integer stamps, an object column's values pickled (an int
    and a float, or -0.0 and 0.0, differ)."""
    import numpy as np

    h = hashlib.sha256(pickle.dumps((len(rows), [(str(c), str(t)) for c, t in rows.dtypes.items()])))
    for i in range(rows.shape[1]):
        column = rows.iloc[:, i]
        if column.dtype.kind == "M":  # datetimes: their integer stamps (the unit and zone are the dtype's)
            h.update(np.ascontiguousarray(column.array.asi8).tobytes())
            continue
        values = column.to_numpy()
        h.update(pickle.dumps(values.tolist()) if values.dtype == object else np.ascontiguousarray(values).tobytes())
    return h.hexdigest()


def reads_digest(reads: object) -> str:
    """sha256 over a part's reads: a frame by its ``rows_digest``, a list, tuple or dict by its
    items', any other value pickled."""
    import pandas as pd

    def plain(v: object) -> object:
        if isinstance(v, pd.DataFrame):
            return ("frame", rows_digest(v.reset_index(drop=True)))
        if isinstance(v, (list, tuple)):
            return (type(v).__name__, [plain(x) for x in v])
        if isinstance(v, dict):
            return ("dict", [(plain(k), plain(x)) for k, x in v.items()])
        return v

    return hashlib.sha256(pickle.dumps(plain(reads))).hexdigest()


NO_CACHE = PartCache()
"""Every part computed, none kept."""
