"""What the runner and the worker say to each other: the metric line format."""

from __future__ import annotations


def metric(value, unit, samples=None, expected=None, exact=False, higher_is_better=None) -> dict:
    return {"value": float(value), "unit": unit, "samples": [float(s) for s in (samples or [])],
            "expected": None if expected is None else float(expected), "exact": exact,
            "higher_is_better": higher_is_better}
