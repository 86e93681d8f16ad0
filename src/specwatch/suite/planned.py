"""``PlannedCase``: one case of a suite's plan, runnable or skipped with the reason."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from specwatch.core.case import Case
from specwatch.own.suite_model import own_skip_reason
from specwatch.rules.validity import RULES, skip_reason


def case_skip_reason(case: Case) -> Optional[str]:
    """Why SGLang (or an own model's limits) would not run the case, or None: the oracle rules
    for the oracle models, ``own_skip_reason`` for a model named by path."""
    return skip_reason(case) if case.own_model is None else own_skip_reason(case, RULES)


@dataclass(frozen=True)
class PlannedCase:
    """A case as planned: runnable (``skip`` is None) or skipped with the reason.

    A ``duplicate`` is a matrix point that normalizes to a case planned earlier: it is listed
    by ``specwatch plan`` but runs (and is recorded) once, under the shared case id.
    """

    case: Case
    skip: Optional[str]
    duplicate: bool = False
    adjusted: tuple[str, ...] = ()
    """SGLang's words for each value it overrides in the matrix point (DFLASH's topk and num_steps)."""
    twin: bool = False
    """A plain-decoding twin planned by ``[suite] speedup`` (``Case.plain_twin``), not a matrix point."""
