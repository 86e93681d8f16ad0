"""Where each SGLang release records its own decode step times, and how the worker reads them.

With ``SGLANG_RECORD_STEP_TIME=1`` in the scheduler's environment (read once, at import of the
module that logs decode stats), every ``decode_log_interval``-th decode forward appends
``gap / decode_log_interval`` to ``step_time_dict[len(batch.reqs)]``, where ``gap`` is the time
since the previous such log (``last_decode_stats_tic``); ``get_internal_state`` returns the dict
as ``step_time_dict``. The lists only grow: a window's steps are the entries added between two
reads. The logging function moved: 0.5.12 has it in ``observability/scheduler_metrics_mixin.py``
and returns the dict from ``Scheduler.get_internal_state``; 0.5.13-0.5.21 in
``managers/scheduler_components/metrics_reporter.py``, still returned by the scheduler; from 0.5.22
``scheduler_components/internal_state.py`` adds it to the state.
"""

from __future__ import annotations

from typing import Optional

from pydantic import BaseModel, ConfigDict

from specwatch.rules.releases import UnknownReleaseError, _release


class StepTimeSource(BaseModel):
    """SGLang's own decode step times in one range of releases."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    first: str
    """First release of the range."""
    last: str
    """Last release of the range."""
    env: str = "SGLANG_RECORD_STEP_TIME"
    """The environment variable that turns the recording on (read at the scheduler's import)."""
    state_key: str = "step_time_dict"
    """The ``get_internal_state`` key: batch size -> step seconds, in the order recorded."""
    interval_arg: str = "decode_log_interval"
    """The server argument: decode forwards per recorded entry (the worker sets it to 1)."""
    recorded_in: str
    """The file under the release's ``sglang/srt/`` that appends the entries."""
    returned_by: str
    """The file that puts the dict into the internal state."""


STEP_TIME_SOURCES: tuple[StepTimeSource, ...] = (
    StepTimeSource(
        first="0.5.12",
        last="0.5.12",
        recorded_in="observability/scheduler_metrics_mixin.py",
        returned_by="managers/scheduler.py",
    ),
    StepTimeSource(
        first="0.5.13",
        last="0.5.21",
        recorded_in="managers/scheduler_components/metrics_reporter.py",
        returned_by="managers/scheduler.py",
    ),
    StepTimeSource(
        first="0.5.22",
        last="0.5.23",
        recorded_in="managers/scheduler_components/metrics_reporter.py",
        returned_by="managers/scheduler_components/internal_state.py",
    ),
)
"""The step-time recording of every release range, oldest first (read from each release's source)."""


def step_time_source(version: str) -> Optional[StepTimeSource]:
    """The step-time recording of ``version``'s range; None for a release outside every range (its
    records say so instead of holding step times of unknown meaning)."""
    try:
        rel = _release(version)
    except UnknownReleaseError:
        return None
    return next((s for s in STEP_TIME_SOURCES if _release(s.first) <= rel <= _release(s.last)), None)
