"""Errors that specwatch reports to users as one clear line (file and field), never a traceback."""

from __future__ import annotations

from pathlib import Path


class SpecwatchInputError(Exception):
    """Bad input: a malformed suite, an unknown value, a result file from a newer schema.

    ``str()`` gives one line naming the file (and the field when known).
    """

    def __init__(self, path: str | Path | None, message: str, field: str | None = None):
        self.path = str(path) if path is not None else None
        self.field = field
        self.message = message
        where = self.path or "<input>"
        if field:
            where = f"{where}: {field}"
        super().__init__(f"{where}: {message}")

    def __reduce__(self):
        """Pickled as its arguments (the dashboard's forked work sends it back to the parent)."""
        return type(self), (self.path, self.message, self.field)


class NewerSchemaError(SpecwatchInputError):
    """A result record written by a newer specwatch than the one reading it."""
