"""``--where FIELD=V1[,V2]``: parsing a selection and applying it to planned cases (with the plain
twins the selected cases need)."""

from __future__ import annotations

import re
from typing import Iterable, Optional

from specwatch.core.case import CASE_FIELDS, Case
from specwatch.core.errors import SpecwatchInputError
from specwatch.own.suite_model import MODEL_NAME_PATTERN
from specwatch.suite.planned import PlannedCase

WHERE_FIELDS: tuple[str, ...] = ("case_id",)
"""Fields ``--where`` takes besides the case's parameters: ``case_id`` re-runs exactly the named cases."""


def _where_value_error(key: str, value: str) -> Optional[str]:
    """Why ``value`` can never match ``key`` (not an integer, not one of the enum's values), or None."""
    if not value:
        return "an empty value matches no case"
    if key == "case_id":
        return None if re.fullmatch(r"[0-9a-f]{12}", value) else "a case id is 12 hex digits"
    if key == "model" and re.fullmatch(MODEL_NAME_PATTERN, value):
        return None  # an oracle size or an own model's name (``Case.model_label``)
    kind = Case.model_fields[key].annotation
    if kind is int:
        return None if re.fullmatch(r"\d+", value) else f"{key} takes integers"
    if kind is bool:
        return None if value in ("true", "false") else f"{key} takes true or false"
    allowed = [e.value.lower() for e in kind]
    return None if value in allowed else f"{key} is one of {', '.join(allowed)}"


def parse_where(terms: list[str]) -> dict[str, set[str]]:
    """``["page_size=64,256", "attention_backend=triton"]`` -> {field: allowed string values}.

    A value that can match no case (``page_size=x``, ``attention_backend=cutlass``) is an error,
    not an empty selection."""
    out: dict[str, set[str]] = {}
    for term in terms:
        key, sep, values = term.partition("=")
        if not sep or key not in CASE_FIELDS + WHERE_FIELDS:
            raise SpecwatchInputError(
                None,
                "--where takes FIELD=V1[,V2], FIELD a case parameter as "
                "`plan --json` prints them (page_size, topk, ...) or case_id",
                field=term,
            )
        for v in (v.strip().lower() for v in values.split(",")):
            why = _where_value_error(key, v)
            if why:
                raise SpecwatchInputError(None, f"--where {key}={v!r} matches no case: {why}", field=term)
            out.setdefault(key, set()).add(v)
    return out


def matches(case: Case, where: dict[str, set[str]]) -> bool:
    """Whether the case's value of every field in ``where`` (from ``parse_where``) is allowed; an
    own model's ``model`` is its name (``model=llama31-8b-eagle3``)."""
    p = dict(case.params(), case_id=case.case_id, model=case.model_label)
    return all(str(p[k]).lower() in vs for k, vs in where.items())


def selected(planned: Iterable[PlannedCase], where: dict[str, set[str]]) -> list[PlannedCase]:
    """The planned cases ``where`` selects (all of them when it is empty), in plan order, with
    the plain-decoding twin of every selected case kept too: ``--where topk=8`` selects EAGLE
    cases and their twins, whose own topk is 1, still run so their records carry speedup."""
    planned = list(planned)
    if not where:
        return planned
    keep = [p for p in planned if matches(p.case, where)]
    needed = {p.case.plain_twin().case_id for p in keep if not p.twin and p.case.algorithm.speculative}
    chosen = {id(p) for p in keep}
    return [p for p in planned if id(p) in chosen or (p.twin and p.case.case_id in needed)]
