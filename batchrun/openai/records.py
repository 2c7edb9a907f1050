"""The records that flow through batchrun: validated requests, bad input lines, attempt outcomes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
EMBEDDINGS = "/v1/embeddings"
SUPPORTED_ENDPOINTS = (CHAT, COMPLETIONS, EMBEDDINGS)


@dataclass(frozen=True, slots=True)
class Request:
    """One valid input line: an OpenAI batch request with its 1-based line number."""

    custom_id: str
    line: int
    url: str
    body: dict[str, Any]


@dataclass(frozen=True, slots=True)
class LineError:
    """An input line that failed validation; it becomes an error record, the job goes on."""

    line: int
    custom_id: str | None
    code: str
    message: str


@dataclass(slots=True)
class Outcome:
    """The result of one attempt at one request, as an engine reports it.

    `body` is the OpenAI response object (ChatCompletion, Completion or CreateEmbeddingResponse,
    as a dict) when `ok`;
    `error` is `{"code": ..., "message": ...}` when not. `retryable` is False for failures that
    would fail the same way again (a bad request), True for engine failures.
    """

    custom_id: str
    ok: bool
    status_code: int
    body: dict[str, Any] | None = None
    error: dict[str, str] | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0
    retryable: bool = False
    extra: dict[str, Any] = field(default_factory=dict)
