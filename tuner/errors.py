"""Errors that reach the user.

A user mistake (a bad file, a bad flag value) must end in one readable line and exit code 2, never a
traceback. Everything that is the user's fault is raised as `UserError`; the CLI catches exactly that.
"""

from __future__ import annotations

from pathlib import Path


class UserError(Exception):
    """A mistake in the user's input: printed as one line, exit code 2.

    `where` is `file:line` (or just `file`), `field` the offending field; both optional so the same type
    serves flag errors too.
    """

    exit_code = 2

    def __init__(self, message: str, *, file: str | Path | None = None, line: int | None = None,
                 field: str | None = None):
        self.message = message
        self.file = str(file) if file is not None else None
        self.line = line
        self.field = field
        super().__init__(self.format())

    def format(self) -> str:
        parts = []
        if self.file is not None:
            parts.append(f"{self.file}:{self.line}" if self.line is not None else self.file)
        if self.field:
            parts.append(self.field)
        parts.append(self.message)
        return ": ".join(parts)
