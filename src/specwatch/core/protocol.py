"""What the runner and the worker say to each other: the spec file and the results-file lines.

The runner writes a ``WorkerSpec`` (``spec.json``) and starts ``python -m specwatch.worker SPEC``;
the worker appends one JSON line per event or finished case to the spec's ``results`` file. Both
sides use these models: the worker builds its lines with them, the runner reads every line with
``parse_line``, which never raises: a line that does not validate comes back as a
``MalformedLine`` carrying the raw text and the validation error, so one bad line costs one case.
"""

from __future__ import annotations

import json
import math
from datetime import datetime
from enum import Enum
from typing import Annotated, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from specwatch.core.case import Case
from specwatch.core.record import Metric, Status


class Event(str, Enum):
    """Names of the event lines (worker side) and of the runner's own worker events."""

    start_lock_held = "start_lock_held"
    """Worker: holds the timing lock shared, so it may start its engine (``core.timing_lock``)."""
    engine_started = "engine_started"
    """Worker: ``sglang.Engine`` is up (carries ``engine_start_s``); a death after it is one case's."""
    engine_facts = "engine_facts"
    """Worker: the probe's pool checks read right after the engine started (``metrics``, ``checks``,
    ``details``); the runner puts them on a crash or timeout record of the group."""
    timing_lock_held = "timing_lock_held"
    """Worker: the engine is up and the worker holds the timing lock exclusively (it times its
    cases); carries ``waited_s``. Until then the runner's group clock does not run."""
    worker_started = "worker_started"
    """Runner only: a worker process was launched (never a results-file line)."""
    worker_exited = "worker_exited"
    """Runner only: a worker process ended; it no longer starts or times anything."""


WIRE_EVENTS = (Event.start_lock_held, Event.engine_started, Event.engine_facts, Event.timing_lock_held)
"""The events a worker writes to its results file."""


class NonFiniteMetric(ValueError):
    """A metric value (or sample, or expectation) that is NaN or infinite: JSON has no such number."""


class MetricLine(Metric):
    """A ``Metric`` as a worker line carries it: every number finite (a NaN would be stored as
    ``null``, which the record reader refuses)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


def metric(value, unit, samples=None, expected=None, exact=False, higher_is_better=None) -> dict:
    """One metric as a worker line's dict; raises ``NonFiniteMetric`` for a NaN or infinite number."""
    numbers = [float(value)] + [float(s) for s in (samples or [])] + ([] if expected is None else [float(expected)])
    if not all(math.isfinite(x) for x in numbers):
        raise NonFiniteMetric(f"not a finite number: value {value!r}, samples {samples!r}, expected {expected!r}")
    return {
        "value": float(value),
        "unit": unit,
        "samples": [float(s) for s in (samples or [])],
        "expected": None if expected is None else float(expected),
        "exact": exact,
        "higher_is_better": higher_is_better,
    }


class WorkerSpec(BaseModel):
    """What ``spec.json`` holds: everything one worker needs to run one engine group."""

    model_config = ConfigDict(extra="forbid")

    cases: list[Case] = Field(min_length=1)
    """The group's cases still to run, in run order; they share every engine-level field."""
    repeats: int = Field(ge=1)
    """Timed batches per case (the suite's ``repeats``)."""
    warmup: bool
    """Run one untimed batch before a case's timed ones (the suite's ``warmup``)."""
    models_dir: str
    """Where the oracle checkpoints are written and read (``oracle.checkpoints.ensure_models``)."""
    fault: Optional[str] = None
    """The injected fault (None: a clean run). The runner also names it in ``SPECWATCH_FAULT`` (the
    worker refuses to run when the two disagree); the worker makes its plan for the installed
    release and hands it to the probe of every SGLang process (``inject.faults.PLAN_ENV``)."""
    probe: bool = True
    """False: a bare run, no specwatch probe in SGLang's processes (no memory facts are read)."""
    results: str
    """The results file the worker appends its lines to."""
    timeout_s: Optional[float] = None
    """The worker's own deadline in seconds, not counting time queued for the timing lock: past it
    the worker kills its own process group. A backstop behind the runner's group timeout (the
    runner gives a little more than its own limit). None: no deadline of its own."""
    min_timed_s: Optional[float] = None
    """Seconds of decode each timed repeat holds at least (the suite's ``min_timed_s``; None: one
    timed batch per repeat)."""
    ci_half_width: Optional[float] = None
    """Relative half-width of the median's bootstrap 95% CI after which repeats stop (the suite's
    ``ci_half_width``; None: exactly ``repeats``)."""
    max_repeats: Optional[int] = None
    """Most repeats while ``ci_half_width`` is not reached (the suite's ``max_repeats``)."""
    step_times: bool = False
    """Record SGLang's own decode step times over the timed batches (the suite's ``step_times``)."""
    pin_cores: bool = False
    """Pin SGLang's processes and the worker to cores of their own (the suite's ``pin_cores``)."""


class BaselineSpec(BaseModel):
    """What a baseline run's spec file holds (``python -m specwatch.worker.baseline SPEC``): one
    ``sglang.Engine`` with the worker's engine arguments for the group, then per case the plain
    loop (``flush_cache()``, one warm-up ``generate``, ``repeats`` timed ``generate`` calls)."""

    model_config = ConfigDict(extra="forbid")

    cases: list[Case] = Field(min_length=1)
    """The cases to time, in run order; they share every engine-level field."""
    repeats: int = Field(ge=1)
    """Timed ``generate`` calls per case, back to back."""
    models_dir: str
    """Where the oracle checkpoints are written and read."""
    results: str
    """The file the baseline appends one ``BaselineLine`` per case to."""
    flushed: bool = False
    """Also time each timed batch after a flush, a prefill-only batch and a second flush (the
    pattern ``scripts/timing_parity.py`` prices the flush with); the runner leaves it off."""
    min_timed_s: Optional[float] = Field(default=None, ge=0)
    """The suite's ``min_timed_s``: each timed repeat is ``generate`` calls back to back until their
    wall time adds up to it (one call per repeat without it), as the probed run's windows are."""
    ci_half_width: Optional[float] = Field(default=None, ge=0)
    """The suite's ``ci_half_width``: repeats go on past ``repeats`` until the bootstrap 95% CI of
    the median is within it (relative), as the probed run's do."""
    max_repeats: Optional[int] = Field(default=None, ge=1)
    """The suite's ``max_repeats``: the most repeats a CI target runs."""
    pin_cores: bool = False
    """The suite's ``pin_cores``: after the engine starts, SGLang's processes and the baseline
    process get cores of their own as the probed worker's do (``worker.pinning``), so the overhead
    compares a pinned loop with a pinned loop."""
    step_times: bool = False
    """The suite's ``step_times``: SGLang's own step-time recording on, as the probed engine has it
    (``worker.step_times.enable``: SGLang's environment variable and ``decode_log_interval``), and
    each case's timed window read from the ``step_time_dict`` of ``Engine.get_server_info()``:
    the clock both loops share."""


class StopReason(str, Enum):
    """Why a case's repeats ended."""

    repeats = "repeats"
    """The suite's fixed ``repeats`` ran (no CI target)."""
    ci_target = "ci_target"
    """The median's bootstrap CI half-width reached ``ci_half_width`` x the median."""
    max_repeats = "max_repeats"
    """``max_repeats`` ran before the CI target was reached."""
    lead = "lead"
    """The leading side of a paired round ended its repeats (``core.turns``): this side's windows
    followed its windows batch for batch."""


class BaselineLine(BaseModel):
    """One case's plain-loop timings, as the baseline process reports them."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    case_id: str
    """``Case.case_id`` of a case of the spec."""
    ok: bool = True
    """False: the case's loop raised (``reason`` says what)."""
    reason: Optional[str] = None
    """Why the case has no timings (the exception, one line)."""
    started_at: Optional[datetime] = None
    """UTC start of the case's loop."""
    finished_at: Optional[datetime] = None
    """UTC end of the case's loop."""
    output_throughput: list[float] = Field(default_factory=list)
    """Output tokens/s of each timed repeat, in run order: its calls' output tokens over their
    wall seconds (one call per repeat without ``BaselineSpec.min_timed_s``)."""
    cached_tokens: list[int] = Field(default_factory=list)
    """Prompt tokens the radix cache served in each timed repeat."""
    batches_per_repeat: Optional[list[int]] = None
    """``generate`` calls of each timed repeat (with ``BaselineSpec.min_timed_s`` or a CI target)."""
    windows_stopped_by: Optional[StopReason] = None
    """Why those repeats ended: ``lead`` where each window ended with the probed worker's in a
    paired round (``core.turns``)."""
    flushed_output_throughput: Optional[list[float]] = None
    """``BaselineSpec.flushed``: output tokens/s of each timed call after the flush pattern."""
    flushed_cached_tokens: Optional[list[int]] = None
    """``BaselineSpec.flushed``: prompt tokens the radix cache served in each such call."""
    core_pinning: Optional[dict] = None
    """``BaselineSpec.pin_cores``: what was pinned where, or why nothing was (as the probed
    record's ``details.core_pinning``)."""
    sglang_step_times: Optional[dict[str, float]] = None
    """``BaselineSpec.step_times``: SGLang's own decode step time over the case's timed window, ms,
    by the probed record's metric names (``sglang_step_time``, ``_p10``, ``_p90``: the window's
    quantiles, ``worker.step_times.StepWindow``)."""
    sglang_step_distribution: Optional[dict[str, float]] = None
    """``BaselineSpec.step_times``: the window's step times as the probed record's
    ``details.sglang_step_times.distribution_ms`` has them (percentiles, max, slow share)."""
    sglang_step_times_error: Optional[str] = None
    """``BaselineSpec.step_times``: why the window has no step times (no recording known for the
    release, none returned, no decode step inside the window)."""


class _Line(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StartLockHeld(_Line):
    """The worker holds the timing lock shared and may start its engine."""

    event: Literal[Event.start_lock_held] = Event.start_lock_held
    """Always ``start_lock_held``."""


class EngineStarted(_Line):
    """``sglang.Engine`` is up."""

    event: Literal[Event.engine_started] = Event.engine_started
    """Always ``engine_started``."""
    engine_start_s: Optional[float] = None
    """Seconds the engine took to start (None: not measured)."""


class EngineFacts(_Line):
    """The probe's pool checks at engine start; they hold for every case of the engine."""

    event: Literal[Event.engine_facts] = Event.engine_facts
    """Always ``engine_facts``."""
    metrics: dict[str, MetricLine] = Field(default_factory=dict)
    """Pool metrics (missing rows and the like)."""
    checks: dict[str, bool] = Field(default_factory=dict)
    """Pool verdicts."""
    details: dict = Field(default_factory=dict)
    """Free-form facts (``pool_coverage_at_start``)."""


class TimingLockHeld(_Line):
    """The worker holds the timing lock exclusively and times its cases."""

    event: Literal[Event.timing_lock_held] = Event.timing_lock_held
    """Always ``timing_lock_held``."""
    waited_s: float = 0.0
    """Seconds the worker queued for the lock behind other engines' timed batches."""


EventLine = Annotated[Union[StartLockHeld, EngineStarted, EngineFacts, TimingLockHeld], Field(discriminator="event")]
"""Any event line, told apart by its ``event`` field."""


class CaseLine(_Line):
    """One finished case, as the worker reports it."""

    case_id: str
    """``Case.case_id`` of a case of the spec."""
    status: Status
    """How the case ended (``ok``, ``skipped`` when SGLang refused the engine, ``failed``)."""
    started_at: Optional[datetime] = None
    """UTC start of the case (None: the runner stamps its own clock)."""
    finished_at: Optional[datetime] = None
    """UTC end of the case (None: the runner stamps its own clock)."""
    reason: Optional[str] = None
    """Why a case is not ok; required then, ignored for an ok case."""
    log_tail: Optional[str] = None
    """Traceback or log lines of a case that is not ok."""
    metrics: dict[str, MetricLine] = Field(default_factory=dict)
    """Metric name -> finite value with unit."""
    checks: dict[str, bool] = Field(default_factory=dict)
    """Named pass/fail checks."""
    details: dict = Field(default_factory=dict)
    """Free-form facts read from SGLang."""

    @model_validator(mode="after")
    def _status_consistent(self) -> "CaseLine":
        if self.status is not Status.ok and not self.reason:
            raise ValueError(f"a {self.status.value} case line needs a reason")
        if self.status is Status.skipped and self.metrics:
            raise ValueError("a skipped case line has no metrics")
        return self


class MalformedLine(BaseModel):
    """A results-file line that is not JSON or does not validate as any line type."""

    raw: str
    """The line as written."""
    error: str
    """Why it was refused (JSON or validation error, one line)."""
    case_id: Optional[str] = None
    """The ``case_id`` the line names, when it is a JSON object that names one."""


Line = Union[StartLockHeld, EngineStarted, EngineFacts, TimingLockHeld, CaseLine]
"""Any well-formed results-file line."""

_EVENT_LINE: TypeAdapter = TypeAdapter(EventLine)


def _one_line(e: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(x) for x in err['loc']) or 'line'}: {err['msg']}" for err in e.errors())


def parse_line(text: str) -> Line | MalformedLine:
    """One results-file line -> its model, or a ``MalformedLine``; never raises."""
    try:
        data = json.loads(text)
    except ValueError as e:
        return MalformedLine(raw=text, error=f"not JSON: {e}")
    if not isinstance(data, dict):
        return MalformedLine(raw=text, error=f"not a JSON object: {type(data).__name__}")
    named = data.get("case_id") if isinstance(data.get("case_id"), str) else None
    try:
        if "event" in data:
            return _EVENT_LINE.validate_python(data)
        return CaseLine.model_validate(data)
    except ValidationError as e:
        return MalformedLine(raw=text, error=_one_line(e), case_id=named)
    except Exception as e:  # noqa: BLE001 - a validator's own error: still one malformed line
        return MalformedLine(raw=text, error=f"{type(e).__name__}: {e}", case_id=named)


def dump_line(line: BaseModel | dict) -> str:
    """A line (a model, or a dict as ``core.timing_lock`` emits) as one JSON text without newline.
    A dict is written as given (values JSON lacks as their ``str``), so it reads back unchanged."""
    if isinstance(line, BaseModel):
        return line.model_dump_json()
    return json.dumps(line, default=str)
