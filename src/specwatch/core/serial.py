"""Optional keys of the record layout written only when set."""

from __future__ import annotations


def omit_when_none(data: dict, *keys: str) -> dict:
    """``data`` without each of ``keys`` whose value is None: an optional key added to the layout is
    written only when it has a value, so a record without it reads as before (older readers refuse
    unknown keys)."""
    for key in keys:
        if data.get(key) is None:
            data.pop(key, None)
    return data
