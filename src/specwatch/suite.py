"""Sweep definitions (``suites/*.toml``): validation and expansion into planned cases.

A suite has a ``[suite]`` header and one or more ``[[matrix]]`` tables. Each matrix is the
cartesian product of its lists; the suite is the union of its matrices. Every expanded case is
kept: an invalid one is planned as skipped with the reason SGLang would give, and a case that
normalization makes identical to an earlier one is planned as skipped naming that case.
"""

from __future__ import annotations

import hashlib
import itertools
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from specwatch.core.case import Algorithm, Backend, Case, ModelSize, Profile, Workload
from specwatch.core.errors import SpecwatchInputError
from specwatch.rules.validity import normalize_draft_tokens, skip_reason

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


class SuiteHeader(BaseModel):
    """The ``[suite]`` table."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="Suite name; names the results file.")
    description: str = Field(default="", description="What the sweep is for.")
    repeats: int = Field(default=3, ge=1, description="Timed repeats per case (median and spread).")
    warmup: bool = Field(default=True, description="Run one untimed batch before timing.")
    timeout_s: int = Field(default=900, ge=10, description="Wall-clock limit per engine group.")


class Matrix(BaseModel):
    """One ``[[matrix]]`` table: lists whose cartesian product gives cases."""

    model_config = ConfigDict(extra="forbid")

    model: list[ModelSize] = Field(default=[ModelSize.tiny], min_length=1)
    algorithm: list[Algorithm] = Field(default=[Algorithm.EAGLE], min_length=1)
    attention_backend: list[Backend] = Field(min_length=1)
    page_size: list[int] = Field(min_length=1)
    topk: list[int] = Field(min_length=1)
    num_steps: list[int] = Field(default=[3], min_length=1)
    num_draft_tokens: list[int] = Field(default=[8], min_length=1)
    tp: list[int] = Field(default=[1], min_length=1)
    dcp: list[int] = Field(default=[1], min_length=1)
    batch_size: list[int] = Field(default=[1], min_length=1)
    input_len: list[int] = Field(default=[128], min_length=1)
    output_len: list[int] = Field(default=[128], min_length=1)
    profile: list[Profile] = Field(default=[Profile.perfect], min_length=1)
    workload: list[Workload] = Field(default=[Workload.standard], min_length=1)
    cuda_graph: list[bool] = Field(default=[True], min_length=1)

    @field_validator("page_size", "topk", "num_steps", "num_draft_tokens", "tp", "dcp",
                     "batch_size", "input_len", "output_len")
    @classmethod
    def _positive(cls, v: list[int]) -> list[int]:
        bad = [x for x in v if x < 1]
        if bad:
            raise ValueError(f"values must be >= 1, got {bad}")
        return v


class SuiteSpec(BaseModel):
    """A whole suite file."""

    model_config = ConfigDict(extra="forbid")

    suite: SuiteHeader
    matrix: list[Matrix] = Field(min_length=1)


@dataclass(frozen=True)
class PlannedCase:
    """A case as planned: runnable (``skip`` is None) or skipped with the reason.

    A ``duplicate`` is a matrix point that normalizes to a case planned earlier: it is listed
    by ``specwatch plan`` but runs (and is recorded) once, under the shared case id.
    """

    case: Case
    skip: Optional[str]
    duplicate: bool = False


@dataclass(frozen=True)
class Suite:
    """A loaded suite: its spec, where it came from and the hash of its bytes."""

    spec: SuiteSpec
    path: Path
    sha256: str

    @property
    def name(self) -> str:
        return self.spec.suite.name

    def plan(self) -> list[PlannedCase]:
        return expand(self.spec)


WHERE_FIELDS: tuple[str, ...] = ("case_id",)
"""Fields ``--where`` takes besides the case's parameters: ``case_id`` re-runs exactly the named cases."""


def parse_where(terms: list[str]) -> dict[str, set[str]]:
    """``["page_size=64,256", "attention_backend=triton"]`` -> {field: allowed string values}."""
    from specwatch.core.case import CASE_FIELDS

    out: dict[str, set[str]] = {}
    for term in terms:
        key, sep, values = term.partition("=")
        if not sep or key not in CASE_FIELDS + WHERE_FIELDS:
            raise SpecwatchInputError(None, "--where takes FIELD=V1[,V2] with FIELD one of "
                                      f"{', '.join(CASE_FIELDS + WHERE_FIELDS)}", field=term)
        out.setdefault(key, set()).update(v.strip().lower() for v in values.split(","))
    return out


def matches(case: Case, where: dict[str, set[str]]) -> bool:
    """Whether the case's value of every field in ``where`` (from ``parse_where``) is allowed."""
    p = dict(case.params(), case_id=case.case_id)
    return all(str(p[k]).lower() in vs for k, vs in where.items())


def _format_loc(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def load_suite(path: str | Path) -> Suite:
    """Read and validate a suite file; errors name the file and the field."""
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
        raise SpecwatchInputError(path, err["msg"] + more, field=_format_loc(err["loc"])) from None
    return Suite(spec=spec, path=path, sha256=hashlib.sha256(raw).hexdigest())


def expand(spec: SuiteSpec) -> list[PlannedCase]:
    """Cartesian product of every matrix, in file order, duplicates planned as skipped."""
    planned: list[PlannedCase] = []
    seen: dict[str, Case] = {}
    for m in spec.matrix:
        fields = list(Matrix.model_fields)
        for values in itertools.product(*(getattr(m, f) for f in fields)):
            p = dict(zip(fields, values))
            requested = p["num_draft_tokens"]
            p["num_draft_tokens"] = normalize_draft_tokens(
                p["algorithm"], p["topk"], p["num_steps"], requested)
            case = Case(**p)
            cid = case.case_id
            if cid in seen:
                why = f"duplicate of case {cid}"
                if requested != case.num_draft_tokens:
                    why += (f" (SGLang adjusts speculative_num_draft_tokens={requested} to "
                            f"speculative_num_steps + 1 = {case.num_draft_tokens} when topk == 1)")
                planned.append(PlannedCase(case, why, duplicate=True))
                continue
            seen[cid] = case
            planned.append(PlannedCase(case, skip_reason(case)))
    return planned
