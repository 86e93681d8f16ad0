"""The record layout's version and the migrations that bring older records up to it."""

from __future__ import annotations

from typing import Callable

SCHEMA_VERSION = 4
"""Version of the record layout. Bump on any incompatible change; readers refuse newer ones and
bring older ones up to date with ``MIGRATIONS``.
2: ``provenance.run_id`` and ``RunSummary.run_id`` (version-1 records read as before, without it).
3: ``details`` is a typed ``Details`` (known keys have declared types; unknown keys are kept).
4: ``provenance.placement`` and ``RunSummary.executor`` (older records read without them)."""


def update_to_2(d: dict) -> dict:
    """Version 1 -> 2: ``provenance.run_id`` is new; a version-1 record has none (reads as None)."""
    return {**d, "schema_version": 2}


def update_to_3(d: dict) -> dict:
    """Version 2 -> 3: ``details`` is a typed ``Details``; a record without details (or ``null``
    ones) holds none. Every key an older record holds keeps its value."""
    return {**d, "details": d.get("details") or {}, "schema_version": 3}


def update_to_4(d: dict) -> dict:
    """Version 3 -> 4: ``provenance.placement`` is new; a version-3 record has none (reads as None)."""
    return {**d, "schema_version": 4}


MIGRATIONS: dict[int, Callable[[dict], dict]] = {2: update_to_2, 3: update_to_3, 4: update_to_4}
"""Target version -> the function that brings a record of the version before it up to it;
``parse_record`` applies them in order, so a record of any older version reads as the current one."""


def migrate(data: dict) -> dict:
    """A record dict of an older ``schema_version`` brought up to ``SCHEMA_VERSION`` (``MIGRATIONS``)."""
    for target in range(data["schema_version"] + 1, SCHEMA_VERSION + 1):
        data = MIGRATIONS[target](data)
    return data
