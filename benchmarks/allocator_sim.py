"""CPU tier: SGLang's allocator classes driven through spec-decode steps (needs sglang importable)."""

from benchmarks.common import SpecwatchBenchmark, suite_values


class AllocatorSimulation(SpecwatchBenchmark):
    param_names = ["page_size", "topk", "fault"]
    params = [[16, 64, 256], [1, 8], ["none", "row-widen-revert"]]

    def skip(self, p):
        from specwatch.core.sglang_host import sglang_importable

        if not sglang_importable():
            return "sglang is not importable in this environment"
        if p["fault"] == "row-widen-revert" and p["topk"] == 1:
            return "the seed bug needs topk > 1"
        return None

    def make_case(self, p):
        from specwatch.cpu.allocator_sim import AcceptPattern, SimConfig, simulate
        from specwatch.inject.faults import SimFault

        fault = None if p["fault"] == "none" else SimFault(p["fault"])
        self.config = SimConfig(
            p["page_size"], p["topk"], 3, 16 if p["topk"] > 1 else 4, fault=fault, accept=AcceptPattern.random
        )
        return simulate(self.config)

    def track_leaked_tokens(self, *args):
        return self.case.leaked_tokens

    track_leaked_tokens.unit = "tokens"

    def track_row_violations(self, *args):
        return len(self.case.row_violations)

    track_row_violations.unit = "violations"

    def time_simulate(self, *args):
        from specwatch.cpu.allocator_sim import simulate

        simulate(self.config)

    def peakmem_simulate(self, *args):
        from specwatch.cpu.allocator_sim import simulate

        simulate(self.config)


class ProbeSample(SpecwatchBenchmark):
    """What specwatch's probe adds to each batch SGLang runs (its run_batch wrapper on SGLang's own
    allocator, on the CPU): the harness overhead that GPU runs cannot separate from engine noise."""

    param_names = ["page_size"]
    params = [suite_values("tree-page", "page_size")]

    def skip(self, p):
        from specwatch.core.sglang_host import sglang_importable

        return None if sglang_importable() else "sglang is not importable in this environment"

    def make_case(self, p):
        return p["page_size"]

    def track_probe_time_per_batch(self, *args):
        from specwatch.cpu.probe_cost import sample_cost_us

        return sample_cost_us(self.case)

    track_probe_time_per_batch.unit = "us"
