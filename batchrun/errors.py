"""The one exception type for errors a user can cause and fix."""

from __future__ import annotations


class BatchrunError(Exception):
    """A user-facing error: the CLI prints its message on one line and exits with `exit_code`."""

    exit_code: int = 1

    def __init__(self, message: str, *, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code
