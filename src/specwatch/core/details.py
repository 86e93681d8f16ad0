"""``Details``: the facts a record keeps beside its metrics, read from SGLang and the worker."""

from __future__ import annotations

from enum import Enum
from typing import Any, Callable, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, model_serializer


class RoundOrder(str, Enum):
    """The order a run's interleaved rounds went in (``details.interleaved["order"]``)."""

    serpentine = "serpentine"
    """Listed order on even rounds, reversed on odd ones (``run.engine_starts.round_order``)."""
    fixed = "fixed"
    """Listed order every round: records without ``order`` ran so."""
    paired = "paired"
    """Both passes of a round at once, taking turns batch by batch (``run.engine_starts.run_pair``, ``--paired``)."""


class BaselineStep(str, Enum):
    """One step of ``details.baseline["order"]``: what ran in round ``k``, labelled ``<step><k>``
    (``probed0``, ``baseline0``, ``paired1``...)."""

    probed = "probed"
    """The probed engine start alone."""
    baseline = "baseline"
    """The plain loop's run alone."""
    paired = "paired"
    """Both at once, taking turns (``--paired``)."""

    def label(self, k: int) -> str:
        """The step's label in round ``k``."""
        return f"{self.value}{k}"

    @classmethod
    def of(cls, label: object) -> Optional["BaselineStep"]:
        """The step a label names (None: no step's)."""
        try:
            return cls(str(label).rstrip("0123456789"))
        except ValueError:
            return None


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
        description="The timed batches' prompt chain starts, per timed batch (one per repeat unless "
        "``timed_windows``; None: recorded before specwatch kept them).",
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
    engine_starts: Optional[dict] = Field(
        default=None,
        description="``[suite] engine_starts`` > 1: ``planned`` starts, ``ran`` (ok starts merged "
        "into this record), and per engine its ``started_at``, ``finished_at``, ``output_digest``, "
        "``host_load``, its ``timed_windows`` (the record's own ``timed_windows`` is the first engine's) "
        "and, with ``step_times``, its ``timed_cpu`` and ``sglang_step_distribution``; a case not ok on some start has ``not_ok_on`` (1-based) instead of engines.",
    )
    baseline: Optional[dict] = Field(
        default=None,
        description="``specwatch run --baseline``: the plain-loop baseline of the case "
        "(``store.baseline``): ``order`` (the runs of its engine group in the order they went, "
        "``probed0``, ``baseline0``, ...; under ``--paired`` ``paired0``, ...), and per baseline run its ``round``, ``started_at``, "
        "``finished_at``, ``output_throughput`` and ``cached_tokens`` per timed repeat (with windows "
        "``batches_per_repeat`` and ``windows_stopped_by``: ``lead`` where they followed the probed windows), or ``error`` "
        "(why that run timed nothing: crashed, timed out, raised); ``reason`` where no run timed anything.",
    )
    interleaved: Optional[dict] = Field(
        default=None,
        description="``specwatch run`` with several ``--fault``: the engine group's passes alternated "
        "start by start (``run.interleave``): ``faults`` in the order they went in the first round "
        "(``none``: the clean pass), ``rounds`` (engine starts per fault) and ``order`` "
        "(``RoundOrder``: ``serpentine``, odd rounds reversed; ``paired``, both passes "
        "of a round at once taking turns; records without it went in the listed order every round).",
    )
    timed_windows: Optional[dict] = Field(
        default=None,
        description="``[suite] min_timed_s`` / ``ci_half_width``: ``repeats`` run, "
        "``batches_per_repeat``, the targets, the relative CI half-width reached and ``stopped_by`` "
        "(``core.protocol.StopReason``).",
    )
    sglang_step_times: Optional[dict] = Field(
        default=None,
        description="``[suite] step_times``: where SGLang recorded its step times, entries in the "
        "timed window and dropped (one per timed batch), batch sizes, ``distribution_ms`` (percentiles, max and "
        "``slow_share``, the steps over 1.25x the window's p10: ``worker.step_times.distribution``); or ``error`` "
        "saying why there are none.",
    )
    timed_cpu: Optional[dict] = Field(
        default=None,
        description="``[suite] step_times``: per timed repeat its ``span_s`` (wall, first timed batch "
        "to last), SGLang's scheduler's CPU seconds (``scheduler_cpu_s``), the steal seconds on its "
        "cores (``core_steal_s``) and on the host (``host_steal_s``), and the scheduler's pid and pinned "
        "cpus (``worker.cpu_readings``); a reading the host does not give is null.",
    )
    turns: Optional[dict] = Field(
        default=None,
        description="``run --baseline --paired``: the units of engine work the worker held the turn for "
        "so far (``units``) and the seconds it waited for them (``waited_s``), its ``side``, and on the "
        "following side the turns it handed straight back before the leader's first timed batch "
        "(``passed``, absent when none), ``core.turns``.",
    )
    core_pinning: Optional[dict] = Field(
        default=None,
        description="``[suite] pin_cores``: ``pinned``, each process's pid, role and cpus, the cores "
        "allowed; or ``reason`` it did not pin.",
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
