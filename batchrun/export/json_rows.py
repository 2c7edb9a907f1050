"""results.parquet rows read another way: a journal record msgspec refuses (NaN, a lone surrogate
escape: old journals) or of an unusual shape is read with json and turned into a row here, and a
choice's logprobs as the nested `logprobs` column holds them (for both readers)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from batchrun.export.embeddings import embedding
from batchrun.export.index import STATUS_NAMES, Entry
from batchrun.job.state import INVALID, OK
from batchrun.openai.responses_api_body import output_text, reasoning_text


def json_row(entry: Entry, rec: dict[str, Any], extras: Sequence[str]) -> tuple[Any, ...]:
    """A results.parquet row (parquet.py's `_row`) for a record as json reads it."""
    body = rec.get("body") if entry.status == OK else None
    choices = body.get("choices") if isinstance(body, dict) else None
    items = choices if choices is not None else body.get("data") if isinstance(body, dict) else None
    if items is None and isinstance(body, dict):
        items = body.get("results")  # a RerankResponse
    first = choices[0] if isinstance(choices, list) and choices else {}
    finish_reason = first.get("finish_reason")
    if "message" in first:
        content = (first.get("message") or {}).get("content")
        reasoning = (first.get("message") or {}).get("reasoning")
    else:
        content, reasoning = first.get("text"), None
    if isinstance(body, dict) and isinstance(body.get("output"), list):  # a Response
        content, reasoning = output_text(body), reasoning_text(body)
        finish_reason = "length" if body.get("status") == "incomplete" else "stop"
        items = [body]
    usage = (body.get("usage") if isinstance(body, dict) else None) or {}
    prompt = int(
        usage.get("prompt_tokens") or usage.get("input_tokens") or rec.get("prompt_tokens") or 0
    )
    completion = int(
        usage.get("completion_tokens")
        or usage.get("output_tokens")
        or rec.get("completion_tokens")
        or 0
    )
    prompt_details = _details(usage, "prompt_tokens_details", "input_tokens_details")
    completion_details = _details(usage, "completion_tokens_details", "output_tokens_details")
    err = rec.get("error") or {}
    invalid = entry.status == INVALID
    values = [
        rec.get("custom_id"),
        entry.line,
        STATUS_NAMES[entry.status],
        None if invalid else rec.get("status_code"),
        content,
        finish_reason,
        len(items) if isinstance(items, list) else 0,
        body.get("model") if isinstance(body, dict) else None,
        prompt,
        completion,
        int(usage.get("total_tokens") or prompt + completion),
        int(prompt_details.get("cached_tokens") or 0),
        int(completion_details.get("reasoning_tokens") or 0),
        err.get("code"),
        err.get("message"),
        entry.attempts,
        None if invalid else rec.get("latency_s"),
        body.get("id") if isinstance(body, dict) else None,
    ]
    for name in extras:
        if not isinstance(body, dict):
            values.append(None)
        elif name == "logprobs":
            values.append(logprob_rows(first.get("logprobs") if isinstance(first, dict) else None))
        elif name == "reasoning":
            values.append(reasoning)
        elif name == "tool_calls":
            message = first.get("message") if isinstance(first, dict) else None
            values.append(
                json_tool_calls(message.get("tool_calls")) if isinstance(message, dict) else None
            )
        elif name == "embeddings":
            data = body.get("data")
            values.append(
                [embedding(x.get("embedding")) if isinstance(x, dict) else None for x in data]
                if isinstance(data, list)
                else None
            )
        elif name == "duration_s":
            values.append(json_duration(body))
        else:  # scores, score_indices
            values.append(json_scores(body, name))
    return tuple(values)


def _details(usage: dict[str, Any], *names: str) -> dict[str, Any]:
    """The first of a usage's token details objects named (chat's, then a Response's names)."""
    for name in names:
        details = usage.get(name)
        if isinstance(details, dict):
            return details
    return {}


def json_tool_calls(calls: object) -> list[dict[str, Any] | None] | None:
    """parquet.py's `_tool_calls` for a message's `tool_calls` as json reads them."""
    if not isinstance(calls, list) or not calls:
        return None
    rows: list[dict[str, Any] | None] = []
    for call in calls:
        if not isinstance(call, dict):
            rows.append(None)  # not a call: msgspec refuses such a record, so only json sees it
            continue
        function = call.get("function")
        function = function if isinstance(function, dict) else {}
        rows.append(
            {
                "id": call.get("id"),
                "type": call.get("type"),
                "name": function.get("name"),
                "arguments": function.get("arguments"),
            }
        )
    return rows


def json_duration(body: dict[str, Any]) -> float | None:
    """parquet.py's `_duration` for a body as json reads it."""
    duration = body.get("duration")
    if isinstance(duration, (int, float)) and not isinstance(duration, bool):
        return float(duration)
    usage = body.get("usage")
    if not isinstance(usage, dict) or usage.get("type") != "duration":
        return None
    seconds = usage.get("seconds")
    return float(seconds) if isinstance(seconds, (int, float)) else None


def json_scores(body: dict[str, Any], name: str) -> list[Any] | None:
    """parquet.py's `_scores` for a body as json reads it."""
    items = body.get("results")
    if isinstance(items, list):
        key = "index" if name == "score_indices" else "relevance_score"
    else:
        items = body.get("data")
        if not (isinstance(items, list) and items and isinstance(items[0], dict)):
            return None
        if "score" not in items[0]:
            return None  # an embeddings body
        key = "index" if name == "score_indices" else "score"
    return [x.get(key) if isinstance(x, dict) else None for x in items]


def logprob_rows(logprobs: object) -> list[dict[str, Any]] | None:
    """A choice's logprobs as [{token, logprob, top_logprobs: [{token, logprob}]}]."""
    if not isinstance(logprobs, dict):
        return None
    if "content" in logprobs:  # chat: ChoiceLogprobs
        return [
            {
                "token": t.get("token"),
                "logprob": t.get("logprob"),
                "top_logprobs": [
                    {"token": c.get("token"), "logprob": c.get("logprob")}
                    for c in t.get("top_logprobs") or []
                ],
            }
            for t in logprobs.get("content") or []
        ]
    # completions: parallel lists, each position's alternatives as a {token: logprob} object
    tokens = logprobs.get("tokens") or []
    token_logprobs = logprobs.get("token_logprobs") or []
    tops = logprobs.get("top_logprobs") or []
    return [
        {
            "token": token,
            "logprob": lp,
            "top_logprobs": [
                {"token": t, "logprob": v}
                for t, v in sorted((top or {}).items(), key=lambda kv: -kv[1])
            ],
        }
        for token, lp, top in zip(tokens, token_logprobs, tops, strict=False)
    ]
