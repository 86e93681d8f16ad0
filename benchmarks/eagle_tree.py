"""GPU workloads of suites/tree-page.toml, as asv tracks.

asv runs these in the environment that holds the SGLang under test. The numbers come from the
records ``specwatch run`` wrote for that SGLang version: ``specwatch asv-import`` reads the store once
per version into a cases file (``SPECWATCH_ASV_CASES``) and runs only the cases it holds; without
one, the records under ``SPECWATCH_RESULTS`` (default ``results/``) are read, selected by
``SPECWATCH_SGLANG_VERSION`` and ``SPECWATCH_MACHINE``. One engine per engine group is far cheaper
than asv's one process per benchmark. A combination with no ok record raises NotImplementedError
(asv shows n/a), with the reason.
"""

import os
from pathlib import Path

from benchmarks.common import SpecwatchBenchmark, suite_values


def _records():
    """Case -> its tracked metric values (``asv_bridge.tree_page_cases``), from the cases file
    ``specwatch asv-import`` wrote or else from the selected version's own results files."""
    from specwatch.core.sglang_host import sglang_version
    from specwatch.present.asv_bridge import CASES_ENV, read_cases, tree_page_cases

    if os.environ.get(CASES_ENV):
        return read_cases(Path(os.environ[CASES_ENV]))
    root = Path(os.environ.get("SPECWATCH_RESULTS", Path(__file__).resolve().parents[1] / "results"))
    # sglang_version honours SPECWATCH_SGLANG_VERSION
    return tree_page_cases(root, sglang_version(), os.environ.get("SPECWATCH_MACHINE"))


RECORDS = _records()
"""Loaded when asv imports this module: its forkserver imports the suite once and forks every
benchmark from it, so each benchmark reads no file."""


def _track(metric: str, unit: str):
    """A ``track_`` function returning the stored value of ``metric`` for the case set up."""

    def track(self, *args):
        return self.case[metric]

    track.unit = unit
    return track


class EagleTree(SpecwatchBenchmark):
    param_names = ["backend", "page_size", "topk", "batch_size", "profile"]
    params = [suite_values("tree-page", f) for f in ("attention_backend", "page_size", "topk", "batch_size", "profile")]

    def skip(self, p):
        if tuple(p.values()) not in RECORDS:
            return "no ok record for this case and SGLang version (not run, skipped or failed: see results/)"
        return None

    def make_case(self, p):
        return RECORDS[tuple(p.values())]

    track_decode_throughput = _track("decode_throughput", "tokens/s")
    track_accept_length = _track("accept_length", "tokens/verify")
    track_req_to_token_bytes = _track("req_to_token_bytes", "bytes")
    track_leaked_tokens = _track("leaked_tokens", "tokens")
    track_lossless_mismatches = _track("lossless_mismatches", "tokens")
