"""What a server's answer to one line means: the line's result, a wait and a retry, or the end of
the job. Pure functions over the status, the bytes and the Retry-After header.

- 200 with a JSON object: the line's answer, journaled as the server gave it (an embeddings
  body's vectors in the journal's base64 float32 form, as a local engine's: openai/vectors.py).
- 429, 502, 503, 504, 408, a dropped connection: the server is busy, restarting or gone for
  a while, not the line at fault: waited out and sent again, no attempt spent (`Retry`).
- 401, 403: the key is wrong; nothing more can succeed (`AuthRefused`: the job stops).
- 500 and other 5xx: the server failed on this line: a failed attempt, retried by the retry
  passes. Other 4xx (400, 404 an unknown model, 413, 422): the line's answer at once, not retried.
- 200 that is not a JSON object: not an OpenAI-compatible answer; a failed attempt (retried).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any

from batchrun.job.journal import encode_body
from batchrun.openai.records import EMBEDDINGS, Outcome, Request
from batchrun.openai.response_bodies import answered, failure
from batchrun.openai.vectors import FLOAT_MARK, base64_of, float32_bytes

# Statuses that say the server (or the way to it) is overloaded or restarting, not the line.
RETRY_STATUSES = frozenset({408, 429, 502, 503, 504})
AUTH_STATUSES = frozenset({401, 403})
# The longest Retry-After honoured (seconds): a server asking for an hour is waited on in turns.
MAX_RETRY_AFTER_S = 300.0
# How much of a non-JSON answer a message quotes.
_QUOTE = 120


@dataclass(frozen=True)
class Retry:
    """Wait and send the line again: the server asked for it (429, 503) or could not be reached."""

    reason: str
    retry_after_s: float | None = None


@dataclass(frozen=True)
class AuthRefused:
    """The server refused the key (401, 403): the job cannot go on."""

    message: str


Verdict = Outcome | Retry | AuthRefused


def verdict(
    request: Request, status: int, raw: bytes, retry_after: str | None, latency_s: float
) -> Verdict:
    """What the server's answer (`status`, its body `raw`) to `request` means."""
    if status in RETRY_STATUSES:
        return Retry(f"HTTP {status}: {error_text(raw)}", parse_retry_after(retry_after))
    if status in AUTH_STATUSES:
        return AuthRefused(f"the server refused the API key (HTTP {status}: {error_text(raw)})")
    if status != 200:
        code, message = server_error(status, raw)
        return failure(
            request, code, message, status_code=status, retryable=status >= 500, latency_s=latency_s
        )
    try:
        body = json.loads(raw)
    except ValueError:
        body = None
    if not isinstance(body, dict):
        return failure(
            request,
            "invalid_response",
            f"the server's answer is not an OpenAI JSON object: {quote(raw)}",
            status_code=502,
            retryable=True,
            latency_s=latency_s,
        )
    if request.url == EMBEDDINGS:
        body = journal_embeddings(request, body)
    usage = body.get("usage")
    prompt_tokens = completion_tokens = 0
    if isinstance(usage, dict):
        prompt_tokens = _count(usage.get("prompt_tokens", usage.get("input_tokens")))
        completion_tokens = _count(usage.get("completion_tokens", usage.get("output_tokens")))
    return answered(
        request,
        # Pre-encoded here, checked for floats (a server's body may hold any): the worker's
        # shortcut for bodies batchrun built itself (response_bodies.holds_no_float) does not
        # apply.
        encode_body(body),
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        latency_s=latency_s,
    )


def journal_embeddings(request: Request, body: dict[str, Any]) -> dict[str, Any]:
    """An embeddings answer in the journal's form: each vector the base64 of its float32 values,
    the body marked first when the line asked for floats (openai/vectors.py)."""
    data = body.get("data")
    if isinstance(data, list):
        for item in data:
            if isinstance(item, dict) and isinstance(item.get("embedding"), list):
                item["embedding"] = base64_of(float32_bytes(item["embedding"]))
    if request.body.get("encoding_format") == "base64":
        return body
    return {FLOAT_MARK: "float", **{k: v for k, v in body.items() if k != FLOAT_MARK}}


def server_error(status: int, raw: bytes) -> tuple[str, str]:
    """The error code and message of a server's error answer (OpenAI's `{"error": {...}}`,
    or vLLM's older `{"object": "error", ...}`), else the status and the text."""
    try:
        data = json.loads(raw)
    except ValueError:
        data = None
    if isinstance(data, dict):
        inner = data.get("error")
        error: dict[str, Any] = inner if isinstance(inner, dict) else data
        message = error.get("message")
        code = error.get("code")
        if not isinstance(code, str) or not code:
            code = error.get("type") if isinstance(error.get("type"), str) else None
        if isinstance(message, str) and message:
            return code or _code_of(status), message
    return _code_of(status), f"HTTP {status} from the server: {quote(raw)}"


def error_text(raw: bytes) -> str:
    """A server error's message, short."""
    return server_error(0, raw)[1] if raw else "no body"


def _code_of(status: int) -> str:
    return {
        400: "invalid_request",
        404: "not_found",
        413: "request_too_large",
        422: "invalid_request",
    }.get(status, "server_error" if status >= 500 else f"http_{status}")


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Retry-After's seconds (a number, or an HTTP date), capped at MAX_RETRY_AFTER_S."""
    if not value:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        try:
            when = parsedate_to_datetime(value).timestamp()
        except (TypeError, ValueError, IndexError):
            return None
        seconds = when - (time.time() if now is None else now)
    if not math.isfinite(seconds):
        return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_S)


def quote(raw: bytes) -> str:
    """The start of an answer's bytes, for a message."""
    text = raw[:_QUOTE].decode("utf-8", "replace").replace("\n", " ").strip()
    return repr(text + ("..." if len(raw) > _QUOTE else "")) if text else "an empty body"


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
