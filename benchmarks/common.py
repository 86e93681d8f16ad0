"""Shared base for specwatch's asv benchmarks (in the style of scikit-learn's asv_benchmarks).

A subclass names its parameter grid in domain terms (``param_names`` such as ``page_size``,
``topk``, ``backend``) and implements ``make_case(params)`` and, where some combinations are
invalid, ``skip(params)`` returning the reason; ``setup`` then raises ``NotImplementedError``
with that reason, which asv shows as n/a.
"""

from __future__ import annotations

from pathlib import Path

SUITES = Path(__file__).resolve().parents[1] / "suites"


class SpecwatchBenchmark:
    """Base class: ``params``/``param_names`` set by subclasses; ``setup`` dispatches to hooks."""

    params: list = []
    param_names: list = []
    timeout = 600

    def skip(self, params: dict):
        """Reason this combination is not supported, or None."""
        return None

    def make_case(self, params: dict):
        """Build what the track_/time_ functions measure (subclass hook)."""
        raise NotImplementedError

    def setup(self, *args):
        params = dict(zip(self.param_names, args))
        reason = self.skip(params)
        if reason:
            raise NotImplementedError(reason)
        self.case = self.make_case(params)


def suite_values(suite: str, field: str) -> list:
    """The distinct values a suite's matrices give ``field``, in order (params stay fed from suites/)."""
    from specwatch.suite import load_suite

    seen = []
    for m in load_suite(SUITES / f"{suite}.toml").spec.matrix:
        for v in getattr(m, field):
            v = getattr(v, "value", v)
            if v not in seen:
                seen.append(v)
    return sorted(seen, key=lambda v: (isinstance(v, str), v))
