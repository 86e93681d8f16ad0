"""The CPU tier over a suite: memory model (both implementations) and allocator simulation per case.

This is what ``specwatch run`` does on a host without a GPU, and what CI exercises.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

import pandas as pd

from specwatch.core.sglang_host import sglang_importable
from specwatch.cpu.allocator_sim import AcceptPattern, SimConfig, simulate
from specwatch.rules.memory_model import SizingInput, compare
from specwatch.suite import Suite, selected

DEFAULT_MAX_RUNNING_REQUESTS = 48


@dataclass
class CpuTierReport:
    """Per-case tables of the CPU tier."""

    memory: pd.DataFrame
    simulation: Optional[pd.DataFrame]

    def write(self, out_dir: Path) -> list[Path]:
        out_dir.mkdir(parents=True, exist_ok=True)
        written = []
        for name, df in (("memory", self.memory), ("simulation", self.simulation)):
            if df is None:
                continue
            csv, js = out_dir / f"{name}.csv", out_dir / f"{name}.json"
            df.to_csv(csv, index=False)
            js.write_text(json.dumps(df.to_dict(orient="records"), indent=1, default=str))
            written += [csv, js]
        return written


def run_cpu_tier(
    suite: Suite, context_len: int = 4096, simulate_allocator: bool = True, where: Optional[dict] = None
) -> CpuTierReport:
    """Memory model for every runnable case; allocator simulation when SGLang is importable."""
    have_sglang = sglang_importable()
    mem_rows, sim_rows = [], []
    seen: set[tuple] = set()
    for planned in selected(suite.plan(), where or {}):
        if planned.skip or planned.duplicate:
            continue
        c = planned.case
        x = SizingInput.for_case(c, context_len, DEFAULT_MAX_RUNNING_REQUESTS)
        ref, sgl, diffs = compare(x)
        row = {
            "case_id": c.case_id,
            "label": c.label(),
            **ref.as_dict(),
            "sglang_agrees": None if sgl is None else not diffs,
            "disagreements": "; ".join(f"{d.field}: specwatch={d.reference} sglang={d.sglang}" for d in diffs),
        }
        mem_rows.append(row)
        key = (c.algorithm, c.page_size, c.topk, c.num_steps, c.num_draft_tokens, c.dcp)
        # the simulation drives the speculative decode path; a plain twin has only its sizing row
        if simulate_allocator and have_sglang and c.algorithm.speculative and key not in seen:
            seen.add(key)
            cfg = SimConfig(
                c.page_size,
                c.topk,
                c.num_steps,
                c.num_draft_tokens,
                algorithm=c.algorithm,
                dcp=c.dcp,
                accept=AcceptPattern.random,
            )
            res = simulate(cfg)
            ran = res.as_dict()
            row = {
                "algorithm": c.algorithm.value,
                "page_size": c.page_size,
                "topk": c.topk,
                "num_steps": c.num_steps,
                "num_draft_tokens": c.num_draft_tokens,
                "dcp": c.dcp,
                **{k: v for k, v in ran.items() if k not in ("config", "sglang_classes")},
                **{f"sglang_classes_{k}": v for k, v in ran["sglang_classes"].items()},  # which classes ran
            }
            if c.dcp > 1:
                # what a target backend that writes KV at virtual slots (no DCP code) would hit near full
                unsharded = simulate(replace(cfg, accept=AcceptPattern.full, near_full=True, kv_write_ignores_dcp=True))
                row["unsharded_kv_write_first_missing_usage"] = unsharded.first_missing_target_usage
            sim_rows.append(row)
    return CpuTierReport(pd.DataFrame(mem_rows), pd.DataFrame(sim_rows) if have_sglang and simulate_allocator else None)
