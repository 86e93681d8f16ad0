"""One line per suite validation error: pydantic's message and location, as a suite file names them."""

from __future__ import annotations


def error_field(loc: tuple) -> str:
    """A pydantic error location as a TOML path: ``matrix[0].page_size``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def error_line(err: dict) -> str:
    """Pydantic's message for one error, with the offending scalar value when it is not in the message."""
    msg = err["msg"]
    value = err.get("input")
    if (
        err["type"] != "out_of_bounds"
        and isinstance(value, (bool, int, float, str))
        and not isinstance(err.get("ctx", {}).get("value"), str)
    ):
        shown = repr(value)
        msg += f" (got {shown if len(shown) <= 40 else shown[:37] + '...'})"
    return msg
