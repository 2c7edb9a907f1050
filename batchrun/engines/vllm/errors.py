"""The error that makes a request a per-request 400 outcome instead of a failed worker."""

from __future__ import annotations


class BadRequest(Exception):
    """A request that can never succeed as written: it becomes a 400 outcome, never retried."""

    def __init__(self, message: str, code: str = "invalid_request") -> None:
        super().__init__(message)
        self.code = code
        self.message = message
