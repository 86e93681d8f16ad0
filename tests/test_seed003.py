"""Seed 003 (the decode watermark rounded up to whole pages) on a release's own allocator.

``scripts/seed003_watermark.py`` drives the unpacked release's ``page_aligned_decode_alloc_lens``,
``PagedTokenToKVPoolAllocator`` and free path with and without specwatch's ``unaligned-watermark``
edit. Skipped without the release cache (``scripts/fetch_sglang_sources.sh``); failed instead with
``SPECWATCH_REQUIRE_SGLANG_SRC=1`` (CI, ``.ci/run``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("SPECWATCH_SGLANG_SRC", ROOT / ".cache" / "sglang-src"))
RELEASE = CACHE / "0.5.23"

pytestmark = pytest.mark.xdist_group("seed003")
"""One xdist worker runs the module (``--dist loadgroup``): the release's allocator runs once, not once per worker."""


@pytest.fixture(scope="module")
def rows() -> dict:
    if not (RELEASE / "sglang" / "srt" / "mem_cache" / "allocation_sizing.py").exists():
        if os.environ.get("SPECWATCH_REQUIRE_SGLANG_SRC") == "1":
            pytest.fail(f"SPECWATCH_REQUIRE_SGLANG_SRC=1 but {RELEASE} is not unpacked")
        pytest.skip(f"no unpacked SGLang 0.5.23 under {CACHE} (COMPILE=0 bash scripts/fetch_sglang_sources.sh)")
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "seed003_watermark.py"), "--root", str(RELEASE)]
        + ["--config", "eagle-tree-p16", "--config", "dflash-p256"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        timeout=300,
        check=True,
    )
    return {r["config"]: r for r in map(json.loads, out.stdout.splitlines())}


def test_the_fault_leaves_the_allocated_pages_unchanged_at_every_step(rows):
    for row in rows.values():
        assert row["same_page_ids_every_step"], row["config"]
        assert row["aligned"]["peak_pages_in_use"] == row["unaligned"]["peak_pages_in_use"]


def test_neither_watermark_leaks_or_double_frees_after_finish_and_retraction(rows):
    for row in rows.values():
        for variant in ("aligned", "unaligned"):
            assert row[variant]["leaked_pages"] == 0, (row["config"], variant)
            assert row[variant]["double_freed_pages"] == 0, (row["config"], variant)


def test_only_the_unaligned_watermark_leaves_a_last_page_tail_unrecorded(rows):
    for row in rows.values():
        assert row["aligned"]["max_unrecorded_tail"] == 0
        assert row["unaligned"]["max_unrecorded_tail"] > 0
        assert row["unaligned"]["steps_with_tail"] == row["unaligned"]["decode_steps"]


def test_sglangs_page_rounded_accounting_cannot_see_it_and_an_unrounded_sum_can(rows):
    for row in rows.values():
        assert row["aligned"]["sglang_accounting_mismatch_steps"] == 0
        assert row["unaligned"]["sglang_accounting_mismatch_steps"] == 0
        assert row["aligned"]["strict_accounting_mismatch_steps"] == 0
        assert row["unaligned"]["strict_accounting_mismatch_steps"] > 0


def test_the_unaligned_watermark_calls_the_allocator_on_more_decode_steps(rows):
    for row in rows.values():
        assert row["unaligned"]["alloc_calls"] > row["aligned"]["alloc_calls"]
