"""Build response bodies in the OpenAI shapes (ChatCompletion, Completion) and error outcomes."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from batchrun.records import CHAT, Outcome, Request


@dataclass(frozen=True, slots=True)
class Choice:
    """One generated sequence of a request (a request with `n` > 1 has several)."""

    text: str
    finish_reason: str  # "stop" or "length"
    token_count: int


def response_model(request: Request, default: str) -> str:
    """The model name to report: the one the request asked for, as OpenAI clients expect."""
    model = request.body.get("model")
    return model if isinstance(model, str) and model else default


def success(
    request: Request,
    choices: Sequence[Choice],
    *,
    model: str,
    prompt_tokens: int,
    latency_s: float,
) -> Outcome:
    """A successful outcome whose body is a ChatCompletion or Completion object."""
    completion_tokens = sum(c.token_count for c in choices)
    created = int(time.time())
    usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    body: dict[str, Any]
    if request.url == CHAT:
        body = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [
                {
                    "index": i,
                    "message": {"role": "assistant", "content": c.text},
                    "logprobs": None,
                    "finish_reason": c.finish_reason,
                }
                for i, c in enumerate(choices)
            ],
            "usage": usage,
        }
    else:
        body = {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": [
                {"index": i, "text": c.text, "logprobs": None, "finish_reason": c.finish_reason}
                for i, c in enumerate(choices)
            ],
            "usage": usage,
        }
    return Outcome(
        custom_id=request.custom_id,
        ok=True,
        status_code=200,
        body=body,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        latency_s=latency_s,
    )


def failure(
    request: Request,
    code: str,
    message: str,
    *,
    status_code: int,
    retryable: bool,
    latency_s: float = 0.0,
) -> Outcome:
    """A failed outcome: 400 for a bad request (not retried), 500 for an engine failure."""
    return Outcome(
        custom_id=request.custom_id,
        ok=False,
        status_code=status_code,
        error={"code": code, "message": message},
        retryable=retryable,
        latency_s=latency_s,
    )
