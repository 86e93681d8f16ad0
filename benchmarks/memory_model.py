"""CPU tier: the analytic memory model (specwatch's formulas) over tree-page's grid."""

from benchmarks.common import SpecwatchBenchmark, suite_values
from specwatch.core.case import Algorithm
from specwatch.rules.memory_model import SizingInput, reference_sizing


class MemoryModel(SpecwatchBenchmark):
    param_names = ["page_size", "topk", "dcp"]
    params = [suite_values("tree-page", "page_size"), suite_values("tree-page", "topk"), [1, 2, 8]]

    def make_case(self, p):
        draft = min(8, 3 * p["topk"] + 1) if p["topk"] > 1 else 4
        return reference_sizing(SizingInput(Algorithm.EAGLE, p["page_size"], p["topk"], 3, draft, 8192, 48, p["dcp"]))

    def track_req_to_token_bytes(self, *args):
        return self.case.req_to_token_bytes

    track_req_to_token_bytes.unit = "bytes"

    def track_alloc_reserve_per_decode(self, *args):
        return self.case.alloc_reserve_per_decode

    track_alloc_reserve_per_decode.unit = "tokens"

    def time_reference_sizing(self, page_size, topk, dcp):
        reference_sizing(SizingInput(Algorithm.EAGLE, page_size, topk, 3, 4, 8192, 48, dcp))
