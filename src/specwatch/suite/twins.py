"""Plain-decoding twins (``[suite] speedup = true``): matrices hold speculative algorithms only, and
each runnable case's twin (``Case.plain_twin``) is planned right before the first case needing it."""

from __future__ import annotations

from typing import Iterator

from pydantic_core import PydanticCustomError

from specwatch.core.case import Algorithm
from specwatch.suite.planned import PlannedCase, case_skip_reason


def refuse_plain(v: Algorithm) -> Algorithm:
    """``v``, or the matrix's error for ``NONE`` (a twin is planned, never listed)."""
    if not v.speculative:
        raise PydanticCustomError(
            "plain_in_matrix",
            "NONE is no speculative algorithm: plain-decoding twins are planned by [suite] speedup = true",
        )
    return v


def with_twins(planned: Iterator[PlannedCase]) -> Iterator[PlannedCase]:
    """``planned`` with each runnable case's plain twin (``Case.plain_twin``) yielded right
    before the first case that needs it: the twin's engine group then runs just before that
    case's, and every later case with the same target reuses it. Skipped and duplicate cases
    get no twin; a twin SGLang would refuse is planned skipped with the reason."""
    seen: set[str] = set()
    for p in planned:
        if p.skip is None and not p.duplicate:
            twin = p.case.plain_twin()
            if twin.case_id not in seen:
                seen.add(twin.case_id)
                yield PlannedCase(twin, case_skip_reason(twin), twin=True)
        yield p
