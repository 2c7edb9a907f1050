"""The body of a /v1/responses answer: a `Response` object, as `openai.types.responses.Response`
parses it and vLLM's server builds it (entrypoints/openai/responses: build_response_output_items,
ResponsesResponse.from_request): a reasoning item when a reasoning parser split reasoning off
(--reasoning-parser), then the assistant message with its output_text.
"""

from __future__ import annotations

import time
from typing import Any

from batchrun.openai.records import Request


def response_object(
    request: Request,
    *,
    text: str,
    finish_reason: str,
    reasoning: str | None,
    reasoning_tokens: int,
    output_tokens: int,
    model: str,
    prompt_tokens: int,
    ids: tuple[str, str, str],
    cached_tokens: int = 0,
) -> dict[str, Any]:
    """A Response: `ids` are the response's, its reasoning item's and its message's id;
    `cached_tokens` of the prompt's were found in the engine's prefix cache."""
    body = request.body
    response_id, reasoning_id, message_id = ids
    incomplete = finish_reason == "length"
    output: list[dict[str, Any]] = []
    if reasoning:
        output.append(
            {
                "id": reasoning_id,
                "type": "reasoning",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": reasoning}],
            }
        )
    if text or not reasoning:
        output.append(
            {
                "id": message_id,
                "type": "message",
                "role": "assistant",
                "status": "incomplete" if incomplete else "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}]
                if text
                else [],
            }
        )
    text_config = body.get("text")
    fmt = text_config.get("format") if isinstance(text_config, dict) else None
    effort = (body.get("reasoning") or {}).get("effort")
    return {
        "id": response_id,
        "object": "response",
        "created_at": int(time.time()),
        "status": "incomplete" if incomplete else "completed",
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "metadata": body.get("metadata") or {},
        "model": model,
        "output": output,
        "parallel_tool_calls": body.get("parallel_tool_calls") is not False,
        "reasoning": {"effort": effort, "summary": None},
        "temperature": _or(body.get("temperature"), 1.0),
        "text": {"format": fmt if fmt is not None else {"type": "text"}},
        "tool_choice": "auto",
        "tools": [],
        "top_p": _or(body.get("top_p"), 1.0),
        "truncation": "disabled",
        "usage": {
            "input_tokens": prompt_tokens,
            "input_tokens_details": {"cached_tokens": cached_tokens, "cache_write_tokens": 0},
            "output_tokens": output_tokens,
            "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
            "total_tokens": prompt_tokens + output_tokens,
        },
    }


def _or(value: Any, default: float) -> float:
    return float(default if value is None else value)


def output_text(body: dict[str, Any]) -> str | None:
    """The text of a Response's assistant message (None when it has none)."""
    return _item_text(body, "message")


def reasoning_text(body: dict[str, Any]) -> str | None:
    """The text of a Response's reasoning item (None when it has none)."""
    return _item_text(body, "reasoning")


def _item_text(body: dict[str, Any], kind: str) -> str | None:
    """The text of a Response's first output item of type `kind` (None when it has none)."""
    for item in body.get("output") or ():
        if isinstance(item, dict) and item.get("type") == kind:
            parts = [p.get("text", "") for p in item.get("content") or () if isinstance(p, dict)]
            return "".join(parts)
    return None
