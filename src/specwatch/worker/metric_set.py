"""``MetricSet``: a case's metric lines, refusing numbers JSON has no form for."""

from __future__ import annotations

from specwatch.core.protocol import NonFiniteMetric, metric


class MetricSet(dict):
    """Metric name -> metric line dict, refusing NaN and infinite numbers: a refused metric is left
    out and named in ``refused`` (the worker then fails the ``finite_metrics`` check)."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.refused: dict[str, str] = {}
        """Metric name -> the refusal (the non-finite numbers it was given)."""

    def put(self, name: str, value, unit: str, samples=None, **kw) -> None:
        try:
            self[name] = metric(value, unit, samples, **kw)
        except NonFiniteMetric as e:
            self.refused[name] = str(e)

    def merge(self, other: dict) -> "MetricSet":
        self.update(other)
        self.refused.update(getattr(other, "refused", {}))
        return self
