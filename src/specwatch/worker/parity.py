"""Parity of an own model: its speculative outputs against the target decoding the same prompts
greedily without speculation.

An own model has no closed form, so lossless is checked against the target itself: before the
group's speculative engine starts, a plain engine (the same arguments, no ``speculative_*``) decodes
every case's prompts once (``plain_outputs``); each case then counts the tokens of its first timed
repeat that differ (``parity_mismatches``) and the first position where one does
(``parity_first_diff``), and records the check ``parity_with_plain``.
"""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass, field
from enum import Enum
from typing import Callable, Optional

from specwatch.core.case import Case
from specwatch.worker.engine_args import greedy_sampling


class ParityStatus(str, Enum):
    """Whether a case's outputs were compared with the plain target's (``details.parity.status``)."""

    compared = "compared"
    """The plain engine decoded the case's prompts; the metrics and the check say how they compare."""
    not_run = "not_run"
    """The plain engine did not start or failed on the prompts (``reason``): no check is recorded."""


@dataclass
class PlainRun:
    """What the plain engine decoded: each case's outputs, in prompt order, or why it did not."""

    outputs: dict[str, list[list[int]]] = field(default_factory=dict)
    """Case id -> the plain output token ids of each of its prompts."""
    reason: Optional[str] = None
    """Why the plain engine did not decode (None: it did)."""
    seconds: float = 0.0
    """Wall time of the plain engine: start, decoding and shutdown."""


def plain_kwargs(kw: dict) -> dict:
    """The speculative engine's arguments without speculation (every ``speculative_*`` dropped)."""
    return {k: v for k, v in kw.items() if not k.startswith("speculative_")}


def plain_outputs(
    engine_cls, kwargs: dict, cases: list[Case], prompts_of: Callable[[Case], list[list[int]]]
) -> PlainRun:
    """Start a plain engine of ``kwargs``, decode every case's prompts greedily in batches of its
    ``batch_size``, shut it down. A failure is kept as the run's ``reason``, never raised."""
    t0, run = time.perf_counter(), PlainRun()
    try:
        engine = engine_cls(**plain_kwargs(kwargs))
        try:
            for c in cases:
                prompts, sp, outs = prompts_of(c), greedy_sampling(c), []
                for i in range(0, len(prompts), c.batch_size):
                    outs += [
                        o["output_ids"]
                        for o in engine.generate(input_ids=prompts[i : i + c.batch_size], sampling_params=sp)
                    ]
                run.outputs[c.case_id] = outs
        finally:
            engine.shutdown()
    except Exception as e:
        run.reason = f"plain engine: {type(e).__name__}: {e}"[:2000] + "\n" + traceback.format_exc()[-1000:]
    run.seconds = time.perf_counter() - t0
    return run


def compare(spec: list[list[int]], plain: list[list[int]]) -> tuple[int, Optional[int], Optional[int]]:
    """(mismatched tokens, first prompt that differs, first position where it does) of two output
    lists; a length difference counts as mismatched tokens at the shorter one's end."""
    mismatches, first = 0, (None, None)
    for i, (a, b) in enumerate(zip(spec, plain, strict=True)):
        diff = [j for j, (x, y) in enumerate(zip(a, b)) if x != y]
        if len(a) != len(b):
            diff.append(min(len(a), len(b)))
        mismatches += len(diff) - (len(a) != len(b)) + abs(len(a) - len(b))
        if diff and first[0] is None:
            first = (i, diff[0])
    return mismatches, first[0], first[1]


def parity_result(case: Case, spec: list[list[int]], plain: Optional[PlainRun]) -> tuple[dict, dict, dict]:
    """(metrics, checks, details) of a case's parity. Metrics are ``(value, unit, kwargs)``
    tuples for ``MetricSet.put``; ``parity_first_diff`` is there only when an output differs."""
    if plain is None or plain.reason or case.case_id not in plain.outputs:
        why = (plain.reason if plain else None) or "no plain outputs for the case"
        return {}, {}, {"parity": {"status": ParityStatus.not_run.value, "reason": why}}
    mismatches, prompt, pos = compare(spec, plain.outputs[case.case_id])
    metrics = {"parity_mismatches": (mismatches, "tokens", {"exact": True, "higher_is_better": False})}
    if pos is not None:
        metrics["parity_first_diff"] = (pos, "tokens", {"exact": True})
    details = {
        "status": ParityStatus.compared.value,
        "prompts": len(spec),
        "first_diff": None if pos is None else {"prompt": prompt, "position": pos},
        "plain_engine_s": round(plain.seconds, 3),
    }
    return metrics, {"parity_with_plain": mismatches == 0}, {"parity": details}
