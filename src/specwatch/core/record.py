"""Typed result records: one per case run, with status, metrics (each with a unit) and provenance."""

from __future__ import annotations

import math
import re
from datetime import datetime, timezone
from enum import Enum
from typing import Annotated, Any, Callable, Optional, Union

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
from specwatch.core.errors import NewerSchemaError, SpecwatchInputError

SCHEMA_VERSION = 3
"""Version of the record layout. Bump on any incompatible change; readers refuse newer ones and
bring older ones up to date with ``MIGRATIONS``.
2: ``provenance.run_id`` and ``RunSummary.run_id`` (version-1 records read as before, without it).
3: ``details`` is a typed ``Details`` (known keys have declared types; unknown keys are kept)."""

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


class HostLoad(BaseModel):
    """The host's 1-minute load average around a case (``/proc/loadavg``)."""

    model_config = ConfigDict(extra="allow", validate_assignment=True)

    before: Optional[float] = Field(default=None, description="Load average as the engine started (None: unknown).")
    after: Optional[float] = Field(default=None, description="Load average after the case's timed batches.")


class Details(BaseModel):
    """Facts read from SGLang and the worker, beside the metrics. The fields below are the keys that
    readers use; any other key a worker writes is kept as it is (``extra="allow"``). Only the keys a
    record holds are written back (``model_fields_set``), so a record re-serializes as it was read.
    Item access (``details["probe"]``, ``get``, ``in``, ``del``) reads and sets the same keys, and
    a ``Details`` equals the dict of the keys it holds."""

    model_config = ConfigDict(extra="allow", validate_assignment=True)

    probe: Optional[dict] = Field(
        default=None,
        description="What specwatch's probe read inside SGLang's "
        "processes (allocator, req_to_token, pools, attention backend, startup phases).",
    )
    pool_coverage: Optional[dict] = Field(
        default=None,
        description="Per KV pool role ('target', 'draft'): its "
        "page, where its valid slots end and where the allocator's last page "
        "ends in its slot space (``rules.pools.pool_coverage``).",
    )
    pool_coverage_at_start: Optional[dict] = Field(
        default=None, description="``pool_coverage`` read right after the engine started (a crashed case keeps these)."
    )
    sglang_sizing: Optional[dict] = Field(
        default=None,
        description="The running SGLang's own req_to_token sizing "
        "fields, or ``{'error': ...}`` where this SGLang has no sizing module.",
    )
    engine_memory_usage: Optional[dict] = Field(default=None, description="SGLang's memory usage report.")
    output_digest: Optional[str] = Field(
        default=None, description="Hash of the timed batches' outputs (identical prompts must give identical digests)."
    )
    prompt_starts: Optional[list] = Field(
        default=None,
        description="The timed batches' prompt chain starts, per repeat (None: recorded before specwatch kept them).",
    )
    near_full_calibration: Optional[dict] = Field(
        default=None, description="A near-full case's prompts lengthened after the warm-up (``input_len``)."
    )
    accept_histogram: Optional[list[int]] = Field(
        default=None, description="Accepted draft tokens per verify step, counted by length."
    )
    prefill_s: Optional[Union[list[float], float]] = Field(
        default=None, description="Prefill seconds per repeat (a single float on older records)."
    )
    decode_split_repeats: Optional[int] = Field(
        default=None, description="Repeats whose decode throughput was split from their prefill."
    )
    turn_prompt_lens: Optional[list[int]] = Field(
        default=None, description="Prompt length of each turn (multi-turn cases)."
    )
    cache_flush_failures: Optional[int] = Field(
        default=None, description="Radix-cache flushes SGLang answered as failed between timed batches."
    )
    cache_flush_refusals: Optional[int] = Field(
        default=None, description="Flushes SGLang refused (scheduler not idle) between timed batches."
    )
    leak_check_flush_refusals: Optional[int] = Field(default=None, description="Flushes refused before the leak check.")
    host_load: Optional[HostLoad] = Field(default=None, description="The host's load average around the case.")
    engine_kwargs: Optional[dict] = Field(default=None, description="The arguments ``sglang.Engine`` was given.")
    engine_args_not_in_this_sglang: Optional[list] = Field(
        default=None, description="Engine arguments the installed SGLang does not take (dropped)."
    )
    sglang_version: Optional[str] = Field(default=None, description="SGLang version the worker's engine reported.")
    bare: Optional[bool] = Field(default=None, description="True: run without the probe (no memory facts).")
    parallel_starts: Optional[int] = Field(
        default=None, description="Engines started at once (K); None: one after another."
    )
    overlap_starts: Optional[bool] = Field(
        default=None, description="Timed while other engines started (``--overlap-starts``): noisier timing."
    )
    waited_for_timing_s: Optional[float] = Field(
        default=None, description="Seconds the case waited for the timing lock before its timed batches."
    )

    @model_serializer(mode="wrap")
    def _only_keys_held(self, handler: Callable) -> dict:
        data = handler(self)
        return {k: v for k, v in data.items() if k in self.model_fields_set}

    def _has(self, key: str) -> bool:
        return key in self.model_fields_set or key in (self.__pydantic_extra__ or {})

    def __getitem__(self, key: str) -> Any:
        if not self._has(key):
            raise KeyError(key)
        return getattr(self, key)

    def __setitem__(self, key: str, value: Any) -> None:
        setattr(self, key, value)

    def __delitem__(self, key: str) -> None:
        if not self._has(key):
            raise KeyError(key)
        if key in type(self).model_fields:
            object.__setattr__(self, key, None)
            self.model_fields_set.discard(key)
        else:
            del self.__pydantic_extra__[key]
            self.model_fields_set.discard(key)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self._has(key)

    def get(self, key: str, default: Any = None) -> Any:
        return self[key] if self._has(key) else default

    def keys(self) -> list[str]:
        return [k for k in self.model_dump()]

    def __eq__(self, other: object) -> bool:
        """Equal to another ``Details`` with the same keys and values, or to a dict of the keys held."""
        if isinstance(other, dict):
            return self.model_dump() == other
        return super().__eq__(other)

    __hash__ = None  # type: ignore[assignment]


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

    @property
    def overlap_starts(self) -> bool:
        """Timed while other engines started (``specwatch run --overlap-starts``): noisier timing."""
        return bool(self.details.overlap_starts)

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


def update_to_2(d: dict) -> dict:
    """Version 1 -> 2: ``provenance.run_id`` is new; a version-1 record has none (reads as None)."""
    return {**d, "schema_version": 2}


def update_to_3(d: dict) -> dict:
    """Version 2 -> 3: ``details`` is a typed ``Details``; a record without details (or ``null``
    ones) holds none. Every key an older record holds keeps its value."""
    return {**d, "details": d.get("details") or {}, "schema_version": 3}


MIGRATIONS: dict[int, Callable[[dict], dict]] = {2: update_to_2, 3: update_to_3}
"""Target version -> the function that brings a record of the version before it up to it;
``parse_record`` applies them in order, so a record of any older version reads as the current one."""


def migrate(data: dict) -> dict:
    """A record dict of an older ``schema_version`` brought up to ``SCHEMA_VERSION`` (``MIGRATIONS``)."""
    for target in range(data["schema_version"] + 1, SCHEMA_VERSION + 1):
        data = MIGRATIONS[target](data)
    return data


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
    """One `specwatch run` on a GPU host: what the sweep cost (issue: sweep wall time vs generation)."""

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
    started_at: datetime = Field(description="UTC start of the run.")
    finished_at: datetime = Field(description="UTC end of the run.")

    @property
    def cost_ratio(self) -> Optional[float]:
        """Wall time over generation time (the issue's goal: under 2)."""
        return self.wall_s / self.case_s if self.case_s else None
