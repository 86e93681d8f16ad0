"""GPU workloads of suites/tree-page.toml, as asv tracks.

asv runs these in the environment that holds the SGLang under test. The numbers come from the
records ``specwatch run`` wrote for that SGLang version (``SPECWATCH_RESULTS``, default
``results/``; ``SPECWATCH_SGLANG_VERSION`` and ``SPECWATCH_MACHINE`` select, as ``specwatch
asv-import`` sets them): one engine per engine group is far cheaper than asv's one process per benchmark.
A combination with no ok record raises NotImplementedError (asv shows n/a), with the reason.
"""

import os
from pathlib import Path

from benchmarks.common import SpecwatchBenchmark, suite_values


def _records():
    """The ok clean tree-page records of the selected SGLang version (and machine): only that
    version's own results files are read, once per asv process (``RECORDS``)."""
    from specwatch.core.sglang_host import sglang_version
    from specwatch.store.jsonl import load_records, result_files, results_path
    from specwatch.store.latest import latest_by_case

    root = Path(os.environ.get("SPECWATCH_RESULTS", Path(__file__).resolve().parents[1] / "results"))
    version = sglang_version()  # honours SPECWATCH_SGLANG_VERSION
    machine = os.environ.get("SPECWATCH_MACHINE")
    files = (
        [results_path(root, machine, version, "tree-page")]
        if machine
        else [f for f in result_files(root) if f.name == "tree-page.jsonl"]
    )
    return {
        (r.case.attention_backend.value, r.case.page_size, r.case.topk, r.case.batch_size, r.case.profile.value): r
        for r in latest_by_case(
            r
            for r in load_records(f for f in files if f.exists())
            if r.suite == "tree-page"
            and r.provenance.sglang_version == version
            and r.status.value == "ok"
            and r.provenance.fault is None
            and (machine is None or r.provenance.machine == machine)
            and not r.overlap_starts
        ).values()
    }  # timed while other engines started: not a trend point


RECORDS = _records()
"""Loaded when asv imports this module: its forkserver imports the suite once and forks every
benchmark from it, so the store is read once per SGLang version, not once per benchmark."""


def _track(metric: str, unit: str):
    """A ``track_`` function returning the stored value of ``metric`` for the case set up."""

    def track(self, *args):
        return self.case.metrics[metric].value

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
