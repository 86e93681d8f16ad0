"""Typed result records: one per case run, with status, metrics (each with a unit) and provenance."""

from __future__ import annotations

import math
import re
from datetime import datetime, timezone
from enum import Enum
from typing import Annotated, Any, Callable, Optional

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_serializer,
    model_validator,
)

from specwatch.core.case import Case
from specwatch.core.details import Details, HostLoad, RoundOrder
from specwatch.core.errors import NewerSchemaError, SpecwatchInputError
from specwatch.core.migrations import MIGRATIONS, SCHEMA_VERSION, migrate, update_to_2, update_to_3
from specwatch.core.placement import Placement, RunPlacement
from specwatch.core.serial import omit_when_none

__all__ = [
    "MIGRATIONS",
    "PATH_PART_RE",
    "SCHEMA_VERSION",
    "CaseRecord",
    "Details",
    "HostLoad",
    "Metric",
    "PathPart",
    "Provenance",
    "RunSummary",
    "Status",
    "check_path_part",
    "migrate",
    "new_run_id",
    "parse_record",
    "update_to_2",
    "update_to_3",
    "utcnow",
]
"""The record schema's names; ``Details``/``HostLoad`` (core.details) and the schema version with
its migrations (core.migrations) are read from here too."""


PATH_PART_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")
"""What a record field that becomes a path component of the store (machine, SGLang version, suite,
fault) may hold: a letter or digit, then letters, digits and ``._+-``; never ``/`` or ``..``."""


def check_path_part(value: str) -> str:
    """``value`` if it is safe as one path component of the store (``PATH_PART_RE``, no ``..``)."""
    if not PATH_PART_RE.match(value) or ".." in value:
        raise ValueError(
            f"{value!r} is not a safe name (letters, digits and ._+- after a letter or digit, no '/' or '..')"
        )
    return value


PathPart = Annotated[str, AfterValidator(check_path_part)]
"""A string that becomes one path component under the results root (``check_path_part``)."""


class Status(str, Enum):
    """How a case ended."""

    ok = "ok"
    """Ran to the end; metrics are valid (checks may still have flagged problems)."""
    skipped = "skipped"
    """Not run: SGLang would refuse it, or the host cannot run it (reason says which)."""
    failed = "failed"
    """SGLang raised a Python exception for this case (e.g. at engine start)."""
    crashed = "crashed"
    """The case's process died (signal, scheduler abort, CUDA error)."""
    timeout = "timeout"
    """The case's process ran past its wall-clock limit and was killed."""


class Metric(BaseModel):
    """One measured (or computed) quantity."""

    model_config = ConfigDict(extra="forbid")

    value: float = Field(description="The reported value: the median over ``samples`` when there are several.")
    unit: str = Field(description="Unit of ``value`` (e.g. 'tokens/s', 'bytes', 'tokens', 'ms', '1').")
    samples: list[float] = Field(default_factory=list, description="Per-repeat values, in run order.")
    expected: Optional[float] = Field(default=None, description="Closed-form value the oracle predicts, when known.")
    exact: bool = Field(default=False, description="True when any change is meaningful (no timing noise).")
    higher_is_better: Optional[bool] = Field(default=None, description="Direction of improvement; None: no direction.")
    engine_medians: Optional[list[float]] = Field(
        default=None,
        description="Each engine start's own value (the median of its repeats), in start order, "
        "where the case ran on several engines (``[suite] engine_starts``); ``value`` is then their "
        "median and ``samples`` every engine's repeats. None (not written): one engine.",
    )

    @model_serializer(mode="wrap")
    def _one_engine_no_key(self, handler: Callable) -> dict:
        """``engine_medians`` is written only when set: a one-engine metric reads as before."""
        return omit_when_none(handler(self), "engine_medians")

    @field_validator("value", mode="before")
    @classmethod
    def _null_is_not_measured(cls, v: Any) -> Any:
        """JSON has no NaN: a NaN value is written as ``null``, and ``null`` reads back as NaN (not
        measured), so such a record loads and a records frame shows the metric as missing."""
        return math.nan if v is None else v

    @field_validator("samples", mode="before")
    @classmethod
    def _null_samples_are_not_measured(cls, v: Any) -> Any:
        """A ``null`` repeat reads as NaN, as ``value`` does."""
        return [math.nan if x is None else x for x in v] if isinstance(v, list) else v


class Provenance(BaseModel):
    """Where and with what a record was produced."""

    model_config = ConfigDict(extra="forbid")

    specwatch_version: str = Field(description="specwatch package version.")
    specwatch_commit: Optional[str] = Field(default=None, description="git commit of the specwatch checkout.")
    sglang_version: Optional[PathPart] = Field(
        default=None, description="Installed sglang version (None: not importable); a path component of the store."
    )
    sglang_commit: Optional[str] = Field(default=None, description="SGLang commit, when known (overlay or build info).")
    torch_version: Optional[str] = Field(default=None, description="torch.__version__.")
    cuda_version: Optional[str] = Field(default=None, description="CUDA version torch was built with.")
    driver_version: Optional[str] = Field(default=None, description="NVIDIA driver version (nvidia-smi).")
    gpu_name: Optional[str] = Field(default=None, description="GPU model name.")
    gpu_count: int = Field(default=0, description="Number of visible GPUs.")
    hostname: str = Field(description="Host name of the machine that ran the case.")
    machine: PathPart = Field(
        description="Machine label results are grouped by (e.g. 'nvidia-h200-x1'); a path component of the store."
    )
    python_version: str = Field(description="Python version.")
    suite_path: Optional[str] = Field(default=None, description="Suite file the case came from.")
    suite_sha256: Optional[str] = Field(default=None, description="sha256 of the suite file's bytes.")
    fault: Optional[PathPart] = Field(
        default=None, description="Name of an injected fault, None for a clean run; part of the results file's name."
    )
    probe: bool = Field(
        default=True,
        description="False: SGLang ran without specwatch's probe in its processes "
        "(a bare timing run, ``specwatch run --bare``: throughput and acceptance, no memory facts).",
    )
    started_at: datetime = Field(description="UTC start time of the case.")
    finished_at: datetime = Field(description="UTC end time of the case.")
    run_id: Optional[str] = Field(
        default=None,
        description="The `specwatch run` invocation that recorded the case "
        "(its RunSummary has the same id), so two runs of one checkout and SGLang, e.g. "
        "an A/A pair, can be told apart. None: recorded before run ids existed.",
    )
    placement: Optional[Placement] = Field(
        default=None,
        description="Executor, host and GPU ids the case's engine group ran on "
        "(``specwatch run --executor``). None: recorded before executors existed.",
    )


class CaseRecord(BaseModel):
    """One run of one case."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    schema_version: int = Field(default=SCHEMA_VERSION, description="Record layout version (see SCHEMA_VERSION).")
    suite: PathPart = Field(description="Suite name; part of the results file's name.")
    case_id: str = Field(description="Stable id of ``case`` (hash of its normalized parameters).")
    case: Case = Field(description="The case's parameters.")
    status: Status = Field(description="How the case ended.")
    reason: Optional[str] = Field(default=None, description="Why it was skipped / failed / crashed; None when ok.")
    log_tail: Optional[str] = Field(default=None, description="Last lines of the case's log (failures).")
    metrics: dict[str, Metric] = Field(default_factory=dict, description="Metric name -> value with unit.")
    checks: dict[str, bool] = Field(
        default_factory=dict, description="Named pass/fail checks (lossless, no_leak, acceptance_matches_oracle, ...)."
    )
    details: Details = Field(
        default_factory=Details,
        description="Facts read from SGLang and the worker (``Details``: typed known keys, any other key kept).",
    )
    provenance: Provenance = Field(description="Where and with what it ran.")
    plain_twin: Optional[str] = Field(
        default=None,
        description="Record id (``<case_id>@<started_at>``) of the plain-decoding twin the "
        "``speedup`` and ``break_even_accept_length`` metrics were computed against (``store.twins``); "
        "None: no twin (the suite has no ``[suite] speedup``, the twin had not finished, or the "
        "record is a twin itself).",
    )

    @model_serializer(mode="wrap")
    def _no_twin_no_key(self, handler: Callable) -> dict:
        """``plain_twin`` is written only when set: a record without a twin reads as before."""
        return omit_when_none(handler(self), "plain_twin")

    @property
    def overlap_starts(self) -> bool:
        """Timed while other engines started (``specwatch run --overlap-starts``): noisier timing."""
        return bool(self.details.overlap_starts)

    @property
    def interleaved_run(self) -> Optional[str]:
        """The run id where its engine starts alternated with other faults' (``details.interleaved``):
        records of two faults with the same one were timed round by round side by side."""
        return self.provenance.run_id if self.details.interleaved else None

    @property
    def paired_turns(self) -> bool:
        """Its passes took turns batch by batch, both engines of a round up at once (``specwatch run
        --paired``: ``details.interleaved`` order ``paired``)."""
        return bool(self.details.interleaved and self.details.interleaved.get("order") == RoundOrder.paired.value)

    @model_validator(mode="after")
    def _status_consistent(self) -> "CaseRecord":
        if self.case_id != self.case.case_id:
            raise ValueError(f"case_id {self.case_id} does not match the case parameters ({self.case.case_id})")
        if self.status is Status.ok and self.reason:
            raise ValueError("an ok record has no reason")
        if self.status is not Status.ok and not self.reason:
            raise ValueError(f"a {self.status.value} record needs a reason")
        if self.status is Status.skipped and self.metrics:
            raise ValueError("a skipped record has no metrics")
        return self


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def new_run_id() -> str:
    """A `specwatch run` id: its UTC start to the second plus 6 random hex digits (sorts by time)."""
    import secrets

    return utcnow().strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(3)


def parse_record(data: Any, source: str = "<record>") -> CaseRecord:
    """Validate one record dict (older schemas migrated first); a record that is not a JSON object,
    has a newer schema or an invalid field gives a ``SpecwatchInputError`` naming the source."""
    if not isinstance(data, dict):
        raise SpecwatchInputError(source, f"not a record: a JSON {type(data).__name__}, not an object")
    version = data.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise SpecwatchInputError(source, "record has no integer schema_version", field="schema_version")
    if version > SCHEMA_VERSION:
        raise NewerSchemaError(
            source,
            f"record has schema_version {version}, this specwatch reads up to {SCHEMA_VERSION}; "
            "upgrade specwatch to read it",
            field="schema_version",
        )
    try:
        return CaseRecord.model_validate(migrate(data))
    except RecursionError:
        raise SpecwatchInputError(source, "record nested too deeply") from None
    except Exception as e:  # pydantic.ValidationError
        errs = getattr(e, "errors", None)
        if errs:
            err = errs()[0]
            field = ".".join(str(x) for x in err["loc"])
            raise SpecwatchInputError(source, err["msg"], field=field) from None
        raise SpecwatchInputError(source, str(e)) from None


class RunSummary(BaseModel):
    """One `specwatch run` on a GPU host: what the sweep cost (its wall time against the generation it ran)."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = Field(default=SCHEMA_VERSION, description="Layout version, as for records.")
    suites: list[PathPart] = Field(description="Suite names run together.")
    faults: list[Optional[PathPart]] = Field(description="Faults each suite ran under (None: clean).")
    parallel_starts: int = Field(description="Engines started at once (1: one after another).")
    overlap_starts: bool = Field(
        default=False,
        description="Starts overlapped other engines' timed batches "
        "(``--overlap-starts``: K groups in flight, no waves).",
    )
    timing_lock_shared: bool = Field(
        default=False,
        description="The timing lock was shared with other "
        "runs (``--timing-lock``): wall time includes their timed batches, so "
        "the cost ratio is not this run's alone.",
    )
    engine_groups: int = Field(description="Engine groups launched (each one sglang.Engine).")
    worker_starts: int = Field(description="Worker processes started (more than groups after crashes).")
    records: dict[str, int] = Field(description="Records written, by status.")
    wall_s: float = Field(description="Wall time of the whole run, seconds.")
    case_s: float = Field(
        description="Sum over ok cases of their own time (warm-up, prefill and timed "
        "batches, leak probe): the generation the sweep exists for."
    )
    engine_start_s: float = Field(description="Sum of the engine start times the ok records report.")
    stopped_early: bool = Field(
        description="True when --stop-after or a signal left engine groups unstarted or unfinished."
    )
    stopped_by: Optional[str] = Field(
        default=None,
        description="Signal that stopped the run (SIGTERM, SIGINT: a "
        "device timeout, ^C); its running groups have no record. None: ran to its end "
        "or --stop-after.",
    )
    specwatch_commit: Optional[str] = Field(default=None, description="git commit of specwatch.")
    sglang_version: Optional[PathPart] = Field(default=None, description="SGLang version run.")
    machine: PathPart = Field(description="Machine label, as in records.")
    run_id: Optional[str] = Field(
        default=None,
        description="Id stamped on every record of this run "
        "(``provenance.run_id``). None: a summary from before run ids existed.",
    )
    executor: Optional[RunPlacement] = Field(
        default=None,
        description="The executor, its version and timing scope, and the hosts and GPU ids the "
        "run's groups ran on. None: a summary from before executors existed.",
    )
    started_at: datetime = Field(description="UTC start of the run.")
    finished_at: datetime = Field(description="UTC end of the run.")

    @property
    def cost_ratio(self) -> Optional[float]:
        """Wall time over generation time (a sweep's target: under 2)."""
        return self.wall_s / self.case_s if self.case_s else None
