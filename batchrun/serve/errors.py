"""An API error in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`."""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """A request the API refuses: its HTTP status and OpenAI's error fields."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        kind: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = (
            status,
            message,
            param,
            code,
            kind,
        )

    def body(self) -> dict[str, Any]:
        """The JSON body of the response."""
        return {
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        }


def not_found(what: str, ident: str) -> ApiError:
    """404 for an id that is not one of ours (shown with repr: it may hold anything)."""
    return ApiError(404, f"No such {what}: {ident!r}", code="not_found")
