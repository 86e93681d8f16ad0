"""The change a timed row of ``compare`` must exceed to be called: a budgets dict's class/metric
budget, or a budget per unit of the row's window spread (``analysis.floor`` hands both over,
``compare_budgets``), else the comparison's threshold.
"""

from __future__ import annotations

from typing import Optional

SPREAD_KEY = "per-window-spread/"
"""A budgets key ``per-window-spread/METRIC``: the budget per unit of a row's window spread
(``analysis.floor.DetectionFloor.per_spread``), which ``budget_for`` scales by the row's spread;
``per-window-spread/`` alone: the least such budget (else the comparison's threshold)."""


ROUNDING = 1e-9
"""Relative slack of a scaled budget: the A/A row whose change / spread set the factor sits exactly
at it, and the verdict's ``(head - base) / base`` can round above the ``head / base - 1`` the
factor came from (by 7e-17 at 1852.1 -> 1958.9)."""


def budget_key(budgets: Optional[dict], klass: str, metric: str) -> Optional[str]:
    """The budget that applies to a class's timed metric: ``CLASS/METRIC``, else ``CLASS``, else None."""
    return next((k for k in (f"{klass}/{metric}", klass) if k in (budgets or {})), None)


def spread_factor(budgets: Optional[dict], klass: str, metric: str, spread: Optional[float]) -> Optional[float]:
    """The factor a row's budget is scaled by (``budget_for``): the budgets' ``SPREAD_KEY`` factor of
    the metric, where the row has a window ``spread`` and a budget is set for its class and metric
    (an A/A pair measured them); None where the row keeps its class budget or the threshold."""
    if spread is None or budget_key(budgets, klass, metric) is None:
        return None
    return budgets.get(f"{SPREAD_KEY}{metric}")


def budget_for(
    budgets: Optional[dict], klass: str, metric: str, threshold: float, spread: Optional[float] = None
) -> float:
    """The relative change a timed metric must exceed: where ``spread_factor`` gives one, that factor
    x the row's window ``spread``, at least the budgets' own least scaled budget (else
    ``threshold``); else the class/metric budget when one is set (it was measured: ``specwatch
    noise`` never derives one below the threshold its pairs ran at), else ``threshold``: a class no
    pair measured is not scaled from the others."""
    factor = spread_factor(budgets, klass, metric, spread)
    if factor is not None:
        return max(budgets.get(SPREAD_KEY, threshold), factor * spread * (1 + ROUNDING))
    key = budget_key(budgets, klass, metric)
    return threshold if key is None else budgets[key]
