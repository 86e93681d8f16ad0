"""A records-frame row's case parameters, and the case id of a case derived from it (its plain or
dcp-1 twin), for oracle and own models alike.

An own model's row cannot be rebuilt into a ``Case``: the frame keeps its name, config hash, dtype
and prompt set (``OWN_PARAMS``, what its id hashes) but not its checkpoint paths, and its ``model``
column holds the model's name (``frame.case_cells``). Its twin's id is derived through an oracle
stand-in of the parameters every case has (``CASE_FIELDS``), its own parameters put back after.
"""

from __future__ import annotations

from typing import Callable

from specwatch.core.case import CASE_FIELDS, OWN_PARAMS, PLAIN_TWIN_RESETS, Case, ModelSize, case_id_of

STAND_IN = ModelSize.tiny
"""The oracle size an own model's row is read under while its twin is derived (never shown)."""

INT_PARAMS = ("prompt_count", "prompt_seed")
"""Own-model parameters that are integers (a frame column holding NaN elsewhere reads them as floats)."""


def _cell(v):
    """A frame cell, None where the frame has none (None or NaN)."""
    return None if v is None or (isinstance(v, float) and v != v) else v


def is_own_row(row: dict) -> bool:
    """Whether a frame row (a dict) is an own model's: only those carry ``model_name``."""
    return isinstance(_cell(row.get("model_name")), str)


def _shared_case(row: dict) -> Case:
    """The row's case with only the parameters every case has (an own model's under ``STAND_IN``)
    and its ``serving_prompts`` where it has one."""
    fields = {f: row[f] for f in CASE_FIELDS}
    if is_own_row(row):
        fields["model"] = STAND_IN.value
    if (n := _cell(row.get("serving_prompts"))) is not None:
        fields["serving_prompts"] = int(n)
    return Case(**fields)


def _params(case: Case, row: dict) -> dict:
    """``case.params()``, with an own model's ``model`` and ``OWN_PARAMS`` taken from ``row``."""
    p = case.params()
    if is_own_row(row):
        p["model"] = ModelSize.own.value
        for k in OWN_PARAMS:
            v = _cell(row.get(k))
            p[k] = int(v) if k in INT_PARAMS and v is not None else v
    return p


def row_params(row: dict) -> dict:
    """The ``Case.params()`` of a frame row's case (``case_id_of`` of it is the row's ``case_id``)."""
    return _params(_shared_case(row), row)


def derived_case_id(row: dict, derive: Callable[[Case], Case]) -> str:
    """The case id of ``derive`` applied to a frame row's case (``Case.plain_twin``, or a copy at
    dcp 1); ``derive`` changes only parameters every case has, an own model's stay its own."""
    return case_id_of(_params(derive(_shared_case(row)), row))


TWIN_KEPT = tuple(f for f in CASE_FIELDS if f not in PLAIN_TWIN_RESETS)
"""The parameters a case's plain twin keeps from it (``Case.plain_twin``): its id depends on these only."""


def plain_twin_id(row: dict) -> str:
    """``derived_case_id(row, Case.plain_twin)``, found once per distinct ``TWIN_KEPT`` values
    (with the serving prompts and an own model's parameters): spec cases that differ only in their
    draft share one twin, whose id is derived once."""
    own = tuple(_cell(row.get(k)) for k in OWN_PARAMS) if is_own_row(row) else None
    key = (tuple(row[f] for f in TWIN_KEPT), _cell(row.get("serving_prompts")), own)
    try:
        return _TWINS[key]
    except KeyError:
        cid = _TWINS[key] = derived_case_id(row, Case.plain_twin)
        return cid
    except TypeError:  # a value that cannot be a key
        return derived_case_id(row, Case.plain_twin)


_TWINS: dict[tuple, str] = {}
"""``plain_twin_id``'s ids by their key, per process."""
