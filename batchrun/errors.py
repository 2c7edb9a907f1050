"""The exception types for errors a user can cause and fix."""

from __future__ import annotations


class BatchrunError(Exception):
    """A user-facing error: the CLI prints its message on one line and exits with `exit_code`."""

    exit_code: int = 1

    def __init__(self, message: str, *, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class GaveUp(BatchrunError):
    """A run stopped for a cause that no restart fixes, everything finished saved: the job goes
    on once the cause is fixed, and the CLI names the command that continues it."""


class OptionError(BatchrunError):
    """A bad option value. `options` names the options involved (e.g. `--dtype`); the message
    says what is wrong without naming them. Exit 2: a usage error."""

    def __init__(self, options: str | tuple[str, ...], message: str, *, exit_code: int = 2) -> None:
        super().__init__(message, exit_code=exit_code)
        self.options = (options,) if isinstance(options, str) else options
