"""Sweep definitions (``suites/*.toml``): validation and expansion into planned cases.

A suite has a ``[suite]`` header and one or more ``[[matrix]]`` tables. Each matrix is the
cartesian product of its lists; the suite is the union of its matrices. Every expanded case is
kept: an invalid one is planned as skipped with the reason SGLang would give, and a case that
normalization makes identical to an earlier one is planned as skipped naming that case.

Values are typed strictly (TOML ``true``, ``"64"`` or ``8.0`` is no integer, ``"yes"`` no boolean)
and every numeric axis is bounded (``AXIS_BOUNDS``), so a typo is one clear error naming the file
and the TOML path instead of a plan. The number of cases is computed from the axes' lengths before
anything is expanded and refused above ``[suite].max_cases``; expansion itself is lazy
(``iter_expand``).
"""

import hashlib
import itertools
import math
import re
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Iterator, Optional

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
    model_validator,
)
from pydantic_core import PydanticCustomError

from specwatch.core.case import Algorithm, Backend, Case, ModelSize, Profile, Workload
from specwatch.core.errors import SpecwatchInputError
from specwatch.oracle.shapes import SHAPES
from specwatch.own.suite_model import ModelEntry, OwnPromptFields, own_fields, resolve_own
from specwatch.rules.validity import normalize_dflash, normalize_draft_tokens
from specwatch.suite.planned import PlannedCase, case_skip_reason
from specwatch.suite.twins import refuse_plain as _speculative
from specwatch.suite.twins import with_twins
from specwatch.suite.validation_errors import error_field, error_line
from specwatch.suite.where import WHERE_FIELDS, matches, parse_where, selected  # noqa: F401 (the package's API)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


CONTEXT_LIMIT = max(s.max_position for s in SHAPES.values())
"""Longest context of any oracle model (``max_position_embeddings``): no prompt or output is longer.
The ``fits-context`` rule checks each case against its own model's context, reserved tokens included."""

MAX_CASES_DEFAULT = 100_000
"""Largest suite planned unless ``[suite].max_cases`` says otherwise."""

MAX_CASES_CEILING = 1_000_000
"""Largest ``max_cases`` accepted: every planned case is held in memory (plan, run, CPU tier)."""

SUITE_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
"""Suite names become results file names and CPU-tier folder names: one plain path component."""


@dataclass(frozen=True)
class Bound:
    """Inclusive bounds of one numeric suite field and why they are what they are."""

    lo: int
    hi: int
    why: str
    """The reason quoted in the error: SGLang's check where one exists, else specwatch's."""

    def check(self, name: str):
        """An ``AfterValidator`` function refusing values outside ``lo..hi`` with ``why``."""

        def _check(v: int) -> int:
            if not self.lo <= v <= self.hi:
                shown = f"{v:.3g}" if abs(v) >= 10**9 else str(v)
                raise PydanticCustomError(
                    "out_of_bounds",
                    "{shown} out of bounds: {name} must be >= {lo} and <= {hi} ({why})",
                    {"shown": shown, "name": name, "lo": self.lo, "hi": self.hi, "why": self.why},
                )
            return v

        return _check


AXIS_BOUNDS: dict[str, Bound] = {
    "page_size": Bound(1, 4096, "SGLang: chunked_prefill_size (8192 on H200) must be divisible by page_size"),
    "topk": Bound(1, 64, "speculative_eagle_topk: draft tree branches"),
    "num_steps": Bound(1, 32, "speculative_num_steps: draft depth"),
    "num_draft_tokens": Bound(1, 1024, "speculative_num_draft_tokens: verified tokens per request"),
    "tp": Bound(1, 64, "tp_size: GPUs one engine spans"),
    "dcp": Bound(1, 64, "SGLang: dcp_size must divide tp_size"),
    "batch_size": Bound(1, 4096, "concurrent requests per batch"),
    "input_len": Bound(1, CONTEXT_LIMIT, "the oracle models' context length"),
    "output_len": Bound(1, CONTEXT_LIMIT, "the oracle models' context length"),
    "serving_prompts": Bound(1, 100_000, "requests per serving benchmark run"),
}
"""Bounds of every numeric ``[[matrix]]`` axis. Upper bounds that no SGLang check sets are
specwatch's: far beyond any swept value, low enough that a typo (``10**23``) is refused. Combinations
SGLang refuses within the bounds (dcp not dividing tp, a page not dividing the prefill chunk, a
prompt past the context with reserved tokens) are planned as skipped by ``rules.validity``."""

HEADER_BOUNDS: dict[str, Bound] = {
    "repeats": Bound(1, 1000, "timed repeats per case"),
    "timeout_s": Bound(10, 86_400, "seconds per engine group; an engine start alone takes 10 s"),
    "max_cases": Bound(1, MAX_CASES_CEILING, "every planned case is held in memory"),
    "engine_starts": Bound(1, 50, "fresh worker processes and engines per case"),
    "max_repeats": Bound(1, 1000, "timed repeats per case while the CI target is not met"),
}
"""Bounds of the numeric ``[suite]`` fields."""


def _suite_name(v: str) -> str:
    if not re.fullmatch(SUITE_NAME_PATTERN, v) or len(v) > 100:
        shown = repr(v)
        raise PydanticCustomError(
            "suite_name",
            "{value} is no plain name (it names result files): must match {pattern}, at most 100 characters",
            {"value": shown if len(shown) <= 40 else shown[:37] + "...", "pattern": SUITE_NAME_PATTERN},
        )
    return v


def _axis(name: str) -> object:
    """List type of one numeric axis: strict integers within ``AXIS_BOUNDS[name]``, at least one."""
    return Annotated[list[Annotated[StrictInt, AfterValidator(AXIS_BOUNDS[name].check(name))]], Field(min_length=1)]


def _header_int(name: str) -> object:
    return Annotated[StrictInt, AfterValidator(HEADER_BOUNDS[name].check(name))]


def _number(v: object) -> object:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise PydanticCustomError("number", "a number is needed (TOML integer or float)")
    return float(v)


def _header_float(gt: float, le: float) -> object:
    """A ``[suite]`` number (TOML integer or float, never a string or boolean) with ``gt < value <= le``."""
    return Annotated[float, BeforeValidator(_number), Field(gt=gt, le=le)]


class SuiteHeader(BaseModel):
    """The ``[suite]`` table."""

    model_config = ConfigDict(extra="forbid")

    name: Annotated[StrictStr, AfterValidator(_suite_name)]
    """Suite name; names the results file (``SUITE.jsonl``) and the CPU tier's output folder."""
    description: StrictStr = ""
    """What the sweep is for."""
    repeats: _header_int("repeats") = 3
    """Timed repeats per case (median and spread)."""
    warmup: StrictBool = True
    """Run one untimed batch before timing."""
    timeout_s: _header_int("timeout_s") = 900
    """Wall-clock limit per engine group, seconds."""
    max_cases: _header_int("max_cases") = MAX_CASES_DEFAULT
    """Largest number of cases the matrices may expand to (counted before expanding)."""
    speedup: StrictBool = False
    """Plan each timing case's no-speculation twin (``Case.plain_twin``) right before the first
    case that needs it, so records carry ``speedup`` over plain decoding (``store.twins``). Off:
    the plan is the matrices' cases only."""
    engine_starts: _header_int("engine_starts") = 1
    """Engine starts per case: the case's engine group runs this many times, each in a fresh worker
    process with a fresh engine, and the case gets one record whose timed metrics carry every
    repeat (``samples``) and each engine's median (``Metric.engine_medians``); the value is the
    median of the engine medians (``run.engine_starts``). 1: one engine, as the plan says."""
    min_timed_s: Optional[_header_float(0.0, 600.0)] = None
    """Seconds of decode each timed repeat holds at least: a repeat runs the case's timed batch
    (each on fresh prompts, each checked against the oracle) until the batches' decode time adds
    up to this (``worker.windows``). None: one timed batch per repeat."""
    ci_half_width: Optional[_header_float(0.0, 1.0)] = None
    """Relative half-width of the bootstrap 95% confidence interval of the median throughput a case
    aims for: after ``repeats`` repeats, more run until the interval's half-width is at most this
    share of the median, or ``max_repeats`` ran. None: exactly ``repeats`` repeats."""
    max_repeats: _header_int("max_repeats") = 20
    """Most timed repeats per case while ``ci_half_width`` is not reached (read only with
    ``ci_half_width``; at least ``repeats``)."""
    step_times: StrictBool = False
    """Record SGLang's own decode step times (``SGLANG_RECORD_STEP_TIME``, read through
    ``get_internal_state``) over each case's timed batches, beside the wall time; the scheduler logs
    every decode step then (``decode_log_interval = 1``); and around each timed repeat the
    scheduler's CPU seconds and the host's steal time (``worker.cpu_readings``). Off: no
    step-time metrics."""
    pin_cores: StrictBool = False
    """After the engine starts, pin each SGLang process (scheduler, tokenizer, detokenizer) and the
    worker to a core of its own among the cores the worker may use (``worker.pinning``); a host
    with too few cores records why it did not pin. Off: the OS schedules them."""

    @model_validator(mode="after")
    def _max_repeats_covers_repeats(self) -> "SuiteHeader":
        if self.ci_half_width is not None and self.max_repeats < self.repeats:
            raise PydanticCustomError(
                "max_repeats",
                "max_repeats {m} < repeats {r}: the CI target adds repeats after the first repeats",
                {"m": self.max_repeats, "r": self.repeats},
            )
        return self


class Matrix(OwnPromptFields):
    """One ``[[matrix]]`` table: lists whose cartesian product gives cases (own models' prompts apart)."""

    model_config = ConfigDict(extra="forbid")

    model: Annotated[list[ModelEntry], Field(min_length=1)] = [ModelSize.tiny]
    """Oracle model sizes and own models (``{name, target, draft, tokenizer, dtype}`` tables)."""
    algorithm: Annotated[list[Annotated[Algorithm, AfterValidator(_speculative)]], Field(min_length=1)] = [
        Algorithm.EAGLE
    ]
    """Speculative algorithms (plain decoding is planned by ``[suite] speedup``, not here)."""
    attention_backend: Annotated[list[Backend], Field(min_length=1)]
    """Attention backends (target and draft)."""
    page_size: _axis("page_size")
    """KV page sizes in tokens."""
    topk: _axis("topk")
    """EAGLE tree branching (NGRAM: BFS breadth)."""
    num_steps: _axis("num_steps") = [3]
    """Draft depths."""
    num_draft_tokens: _axis("num_draft_tokens") = [8]
    """Verified tree sizes (normalized to num_steps + 1 when topk == 1)."""
    tp: _axis("tp") = [1]
    """Tensor parallel sizes."""
    dcp: _axis("dcp") = [1]
    """Decode context parallel sizes."""
    batch_size: _axis("batch_size") = [1]
    """Concurrent requests in the timed batch."""
    input_len: _axis("input_len") = [128]
    """Prompt lengths in tokens."""
    output_len: _axis("output_len") = [128]
    """New tokens per request."""
    profile: Annotated[list[Profile], Field(min_length=1)] = [Profile.perfect]
    """Oracle acceptance profiles."""
    workload: Annotated[list[Workload], Field(min_length=1)] = [Workload.standard]
    """Request-stream shapes."""
    cuda_graph: Annotated[list[StrictBool], Field(min_length=1)] = [True]
    """Whether CUDA graphs are enabled."""
    serving_prompts: Annotated[
        list[Optional[Annotated[StrictInt, AfterValidator(AXIS_BOUNDS["serving_prompts"].check("serving_prompts"))]]],
        Field(min_length=1),
    ] = [None]
    """Requests per serving benchmark run (``Case.serving_prompts``; the serving workload only).
    Left out: ``SERVING_PROMPTS_DEFAULT`` requests, and the case id without the field."""

    @model_validator(mode="after")
    def _serving_prompts_serving_only(self) -> "Matrix":
        if self.serving_prompts != [None] and any(w is not Workload.serving for w in self.workload):
            raise PydanticCustomError(
                "serving_only",
                "serving_prompts applies to the serving workload only: give it in a matrix whose workload is ['serving']",
            )
        return self

    def axis_sizes(self) -> dict[str, int]:
        """Length of every axis, in field order."""
        return {f: len(getattr(self, f)) for f in AXES}

    def case_count(self) -> int:
        """Cases this matrix expands to: the product of its axes' lengths."""
        return math.prod(self.axis_sizes().values())


class SuiteSpec(BaseModel):
    """A whole suite file."""

    model_config = ConfigDict(extra="forbid")

    suite: SuiteHeader
    """The ``[suite]`` header."""
    matrix: Annotated[list[Matrix], Field(min_length=1)]
    """The ``[[matrix]]`` tables, in file order."""

    def case_count(self) -> int:
        """Matrix points the suite expands to (duplicates included), computed without expanding;
        ``speedup``'s plain twins come on top (at most one per point, usually far fewer)."""
        return sum(m.case_count() for m in self.matrix)


@dataclass(frozen=True)
class Suite:
    """A loaded suite: its spec, where it came from and the hash of its bytes."""

    spec: SuiteSpec
    path: Path
    sha256: str

    @property
    def name(self) -> str:
        return self.spec.suite.name

    @property
    def case_count(self) -> int:
        """Cases the plan holds (duplicates included), known without expanding."""
        return self.spec.case_count()

    def plan(self) -> list[PlannedCase]:
        return expand(self.spec)

    def iter_plan(self) -> Iterator[PlannedCase]:
        """The plan one case at a time (``iter_expand``)."""
        return iter_expand(self.spec)

    def with_header(self, **fields) -> "Suite":
        """This suite with ``[suite]`` fields replaced (``speedup=False``: no plain twins), path and hash kept."""
        header = self.spec.suite.model_copy(update=fields)
        return replace(self, spec=self.spec.model_copy(update={"suite": header}))


AXES: tuple[str, ...] = tuple(f for f in Matrix.model_fields if not f.startswith("prompt"))
"""The ``[[matrix]]`` fields whose cartesian product gives cases (``prompts*`` are per matrix)."""


def load_suite(path: str | Path) -> Suite:
    """Read and validate a suite file; errors name the file and the field (TOML path)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise SpecwatchInputError(path, f"cannot read suite: {e.strerror}") from None
    try:
        data = tomllib.loads(raw.decode())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise SpecwatchInputError(path, f"not valid TOML: {e}") from None
    try:
        spec = SuiteSpec.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        more = f" (+{e.error_count() - 1} more)" if e.error_count() > 1 else ""
        raise SpecwatchInputError(path, error_line(err) + more, field=error_field(err["loc"])) from None
    check_case_count(spec, path)
    resolve_own(spec, path)
    return Suite(spec=spec, path=path, sha256=hashlib.sha256(raw).hexdigest())


def check_case_count(spec: SuiteSpec, path: str | Path | None = None) -> int:
    """The suite's case count, computed from the axes' lengths; refuses more than ``max_cases``
    with one line naming the largest matrix and its axes' sizes."""
    total, limit = spec.case_count(), spec.suite.max_cases
    if total <= limit:
        return total
    i, m = max(enumerate(spec.matrix), key=lambda im: im[1].case_count())
    axes = " x ".join(f"{f} {n}" for f, n in m.axis_sizes().items() if n > 1)
    raise SpecwatchInputError(
        path,
        f"{total:,} cases > max_cases {limit:,} (suite.max_cases, up to {MAX_CASES_CEILING:,}); matrix[{i}]: {axes}",
        field="matrix",
    )


def iter_expand(spec: SuiteSpec) -> Iterator[PlannedCase]:
    """Cartesian product of every matrix, in file order, one case at a time; a case that
    normalizes to an earlier one is yielded as a skipped duplicate naming it. With ``speedup``,
    a runnable case's plain twin comes right before it, once per twin (``with_twins``)."""
    cases = _matrix_points(spec)
    return with_twins(cases) if spec.suite.speedup else cases


def _matrix_points(spec: SuiteSpec) -> Iterator[PlannedCase]:
    """The matrices' cases (``iter_expand`` without twins)."""
    fields = list(AXES)
    seen: set[str] = set()
    resolve_own(spec, None)
    for m in spec.matrix:
        for values in itertools.product(*(getattr(m, f) for f in fields)):
            p = own_fields(m, dict(zip(fields, values)))
            requested = p["num_draft_tokens"]
            p["topk"], p["num_steps"], adjusted = normalize_dflash(p["algorithm"], p["topk"], p["num_steps"])
            p["num_draft_tokens"] = normalize_draft_tokens(p["algorithm"], p["topk"], p["num_steps"], requested)
            case = Case(**p)
            cid = case.case_id
            if cid in seen:
                why = f"duplicate of case {cid}"
                if requested != case.num_draft_tokens:
                    why += (
                        f" (SGLang adjusts speculative_num_draft_tokens={requested} to "
                        f"speculative_num_steps + 1 = {case.num_draft_tokens} when topk == 1)"
                    )
                if adjusted:
                    why += " (SGLang: " + " ".join(adjusted) + ")"
                yield PlannedCase(case, why, duplicate=True, adjusted=adjusted)
                continue
            seen.add(cid)
            yield PlannedCase(case, case_skip_reason(case), adjusted=adjusted)


def expand(spec: SuiteSpec) -> list[PlannedCase]:
    """Every planned case of the suite (``iter_expand`` as a list), refused above ``max_cases``."""
    check_case_count(spec)
    return list(iter_expand(spec))
