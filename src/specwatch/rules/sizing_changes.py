"""Which SGLang release changed what in spec-decode KV sizing: the memory model's version table.

``reference_sizing(x, version)`` applies a change from its release on (None: every change).
Each change names a marker, text that is in the named file of every release from ``since`` on and
in none before it; ``tests/test_release_sizing.py`` checks that against every cached release
source (0.5.12-0.5.23), so a row here cannot drift from the code it describes, and
``tests/test_sizing_changes.py`` that a release's own sizing differs from its predecessor's on the
memory model's configurations exactly where this table names a change in that release.

From 0.5.17 to 0.5.23 two rows apply, both from 0.5.19: ``sizing_on_allocator_page`` (rows, the
per-decode allocation and the tree footprint at DCP > 1) and ``dflash_watermark_aligned`` (DFLASH's
watermark); 0.5.20-0.5.23 size every configuration as 0.5.19 does.
"""

from __future__ import annotations

from enum import Enum
from typing import Optional

from pydantic import BaseModel, ConfigDict


class Change(str, Enum):
    """A sizing rule that some SGLang release introduced."""

    row_reserve = "row-reserve"
    """The paged spec-decode req_to_token row makes room for the per-decode reserve (0.5.12 sizes
    every row C + 4 + num_draft_tokens)."""
    row_page_slack = "row-page-slack"
    """The paged spec-decode row adds page_size - 1 slots past the reserve, and is widened for
    every topk (0.5.13-0.5.15 widen it for topk > 1 only: ``mem_cache/common.py``)."""
    eagle_watermark_aligned = "eagle-watermark-aligned"
    """EAGLE's decode watermark is rounded up to a whole allocator page."""
    dflash_watermark_aligned = "dflash-watermark-aligned"
    """DFLASH's decode watermark (committed + 2 * block_size) is rounded up to a whole allocator
    page (``page_aligned_decode_alloc_lens``); before, ``max(cur, committed + 2 * block_size)``."""
    sizing_on_allocator_page = "sizing-on-allocator-page"
    """The sizing functions round to the allocator's page (server page x DCP size,
    ``get_alloc_page_size``), not the server page: the row's page slack and the tree footprint
    grow with DCP."""
    ngram_flat_alloc = "ngram-flat-alloc"
    """A draft without KV (NGRAM) sizes its decode step max(steps * topk, draft) at every page; before,
    NGRAM at topk > 1 on paged KV got the tree's per-branch page footprint."""
    dflash = "dflash"
    """DFLASH exists (``speculative/dflash_info_v2.py``)."""


class SizingChange(BaseModel):
    """One row of the version table."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)

    change: Change
    """What changed."""
    since: tuple[int, int, int]
    """First release with the change."""
    files: tuple[str, ...]
    """Files (under ``sglang/srt/``) that may hold the marker."""
    marker: str
    """Regular expression found in one of ``files`` from ``since`` on and in none before."""


CHANGES: tuple[SizingChange, ...] = (
    SizingChange(
        change=Change.row_reserve,
        since=(0, 5, 13),
        files=("mem_cache/common.py", "mem_cache/allocation_sizing.py"),
        marker=r"def get_req_to_token_extra_context_len",
    ),
    SizingChange(
        change=Change.row_page_slack,
        since=(0, 5, 16),
        files=("mem_cache/allocation_sizing.py",),
        marker=r"get_alloc_reserve_per_decode\((server_args)?\) \+ (server_args\.)?page_size - 1",
    ),
    SizingChange(
        change=Change.eagle_watermark_aligned,
        since=(0, 5, 16),
        files=("speculative/eagle_utils.py",),
        marker=r"double_alloc \+ page_size - 1\)|page_aligned_decode_alloc_lens\(",
    ),
    SizingChange(
        change=Change.dflash_watermark_aligned,
        since=(0, 5, 19),
        files=("speculative/dflash_info_v2.py",),
        marker=r"page_aligned_decode_alloc_lens\(",
    ),
    SizingChange(
        change=Change.sizing_on_allocator_page,
        since=(0, 5, 19),
        files=("mem_cache/allocation_sizing.py",),
        marker=r"page_size = get_alloc_page_size\(\)",
    ),
    SizingChange(
        change=Change.ngram_flat_alloc,
        since=(0, 5, 14),
        files=("mem_cache/common.py", "mem_cache/allocation_sizing.py"),
        marker=r"not spec_algo\.has_draft_kv\(\)",
    ),
    SizingChange(
        change=Change.dflash,
        since=(0, 5, 14),
        files=("speculative/dflash_info_v2.py",),
        marker=r"2 \* block_size",
    ),
)
"""Every change, oldest first."""

_BY_CHANGE = {c.change: c for c in CHANGES}


def has(change: Change, release: Optional[tuple[int, ...]]) -> bool:
    """Whether ``release`` ((0, 5, 17); None: the newest rules) has ``change``."""
    return release is None or tuple(release[:3]) >= _BY_CHANGE[change].since
