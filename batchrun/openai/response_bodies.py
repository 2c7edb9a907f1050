"""Build response bodies in the OpenAI shapes and error outcomes.

Bodies are exactly what the `openai` package's types describe: `ChatCompletion` for
/v1/chat/completions, `Completion` for /v1/completions, `CreateEmbeddingResponse` for
/v1/embeddings and `Response` for /v1/responses (shaped in responses_api_body), logprobs included (`ChoiceLogprobs` for chat, the legacy `Logprobs` for
completions). Engines hand over plain values (`Choice`, `TokenLogprob`, vectors); the shaping is
here, once, for every engine (vLLM's score and rerank bodies: in scoring_body). An embeddings
body is built in the form the journal keeps (vectors as float32 bytes: openai/vectors.py), and
becomes the OpenAI object when export writes it.
"""

from __future__ import annotations

import base64
import itertools
import math
import os
import struct
import time
from collections.abc import Sequence
from typing import Any

import msgspec

from batchrun.openai.records import CHAT, RESPONSES, Outcome, Request
from batchrun.openai.responses_api_body import response_object
from batchrun.openai.vectors import FLOAT_MARK, base64_of, float32_bytes

# OpenAI's stand-in for a logprob too small to show (and JSON has no -Infinity).
MIN_LOGPROB = -9999.0


def _reseed_ids() -> None:
    """A fresh random start for response ids: per process (a forked child included)."""
    global _id_base, _id_counter
    _id_base = int.from_bytes(os.urandom(16), "big")
    _id_counter = itertools.count()


_ID_MASK = (1 << 128) - 1
_id_base = 0
_id_counter = itertools.count()
_reseed_ids()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reseed_ids)


def response_id() -> str:
    """32 hex digits that identify a response, like a uuid4's hex, but cheaper: a random 128-bit
    start per process, plus a counter."""
    return f"{(_id_base + next(_id_counter)) & _ID_MASK:032x}"


class TokenLogprob(msgspec.Struct, frozen=True):
    """One generated token: its text, UTF-8 bytes, logprob, and the most likely alternatives.

    `top` holds (token, bytes, logprob) triples, most likely first, as many as were asked for.
    """

    token: str
    token_bytes: bytes | None
    logprob: float
    top: tuple[tuple[str, bytes | None, float], ...] = ()


class Choice(msgspec.Struct, frozen=True):
    """One generated sequence of a request (a request with `n` > 1 has several).

    A msgspec Struct (as TokenLogprob): an engine makes one per request, and a frozen
    dataclass sets each of its fields through object.__setattr__, several times slower.
    """

    text: str
    # "stop", "length" or "tool_calls": the engine decides (a named forced call ends in "stop",
    # as OpenAI's and vLLM's do).
    finish_reason: str
    token_count: int
    # Per generated token, when the request asked for logprobs.
    logprobs: Sequence[TokenLogprob] | None = None
    # OpenAI-shaped tool calls ({"id", "type": "function", "function": {...}}), chat only.
    tool_calls: Sequence[dict[str, Any]] | None = None
    # The reasoning a reasoning parser split from the text (--reasoning-parser), and its tokens.
    reasoning: str | None = None
    reasoning_tokens: int = 0


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
    reasoning: bool = False,
    cached_tokens: int | None = None,
) -> Outcome:
    """A successful outcome whose body is a ChatCompletion, Completion or Response object.

    `reasoning`: the engine runs a reasoning parser, so the usage counts reasoning tokens (in
    `completion_tokens_details`, as vLLM's server reports them then). `cached_tokens`: the prompt
    tokens the engine found in its prefix cache (None: an engine without one), reported as
    OpenAI reports them (`prompt_tokens_details.cached_tokens`; a Response's
    `input_tokens_details.cached_tokens`).
    """
    completion_tokens = (
        choices[0].token_count if len(choices) == 1 else sum([c.token_count for c in choices])
    )
    created = int(time.time())
    usage: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if cached_tokens is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    if reasoning:
        usage["completion_tokens_details"] = {
            "reasoning_tokens": sum([c.reasoning_tokens for c in choices])
        }
    body: dict[str, Any]
    if request.url == RESPONSES:
        # One choice: the Responses API has no n.
        first = choices[0]
        body = response_object(
            request,
            text=first.text,
            finish_reason=first.finish_reason,
            reasoning=first.reasoning,
            reasoning_tokens=first.reasoning_tokens,
            output_tokens=completion_tokens,
            model=model,
            prompt_tokens=prompt_tokens,
            cached_tokens=cached_tokens or 0,
            ids=(f"resp_{response_id()}", f"rs_{response_id()}", f"msg_{response_id()}"),
        )
    elif request.url == CHAT:
        body = {
            "id": f"chatcmpl-{response_id()}",
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [_chat_choice(i, c, reasoning) for i, c in enumerate(choices)],
            "usage": usage,
        }
        metadata = request.body.get("metadata")
        if metadata is not None:
            body["metadata"] = metadata  # ChatCompletion carries the request's metadata back
    else:
        body = {
            "id": f"cmpl-{response_id()}",
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": [
                {
                    "index": i,
                    "text": c.text,
                    "logprobs": None if c.logprobs is None else completion_logprobs(c.logprobs),
                    "finish_reason": c.finish_reason,
                }
                for i, c in enumerate(choices)
            ],
            "usage": usage,
        }
    return answered(
        request,
        body,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        latency_s=latency_s,
    )


# The bodies `success` builds, whose values are text and integers but for logprobs, tool calls
# and metadata.
_TEXT_OBJECTS = frozenset(("chat.completion", "text_completion"))


def holds_no_float(body: dict[str, Any]) -> bool:
    """Whether a body `success` or `embedding_success` built holds no float at all: no logprobs,
    tool calls or request metadata; embeddings as base64. (Its JSON then needs no check for
    floats that encoders write differently; see journal.encode_body.)"""
    if body.get("object") == "list" and "usage" in body:
        # An embeddings body: its vectors are base64 text (embedding_success), its usage counts.
        data = body.get("data")
        return isinstance(data, list) and all(
            isinstance(item, dict) and type(item.get("embedding")) is str for item in data
        )
    if body.get("object") not in _TEXT_OBJECTS or "metadata" in body:
        return False
    for choice in body["choices"]:
        if choice["logprobs"] is not None:
            return False
        message = choice.get("message")
        if message is not None and "tool_calls" in message:
            return False
    return True


def embedding_success(
    request: Request,
    vectors: Sequence[Sequence[float] | bytes],
    *,
    model: str,
    prompt_tokens: int,
    latency_s: float,
) -> Outcome:
    """A successful outcome whose body is a CreateEmbeddingResponse, one vector per input, in
    the form the journal keeps (openai/vectors.py): each embedding the base64 of its
    little-endian float32 values, as OpenAI sends it for `encoding_format: "base64"`; for a
    request that asked for floats, the body begins with `"export_encoding": "float"`, and export
    writes its vectors as float lists.

    `vectors`: each little-endian float32 bytes (an engine's pooled values, as they are), or
    floats (rounded to float32).
    """
    data = [
        {"object": "embedding", "index": i, "embedding": base64_of(float32_bytes(v))}
        for i, v in enumerate(vectors)
    ]
    body: dict[str, Any] = {}
    if request.body.get("encoding_format") != "base64":
        body[FLOAT_MARK] = "float"  # first: export finds it at the body's start
    body["object"] = "list"
    body["data"] = data
    body["model"] = model
    body["usage"] = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}
    return answered(
        request,
        body,
        prompt_tokens=prompt_tokens,
        latency_s=latency_s,
    )


def encode_base64(vector: Sequence[float]) -> str:
    """An embedding as OpenAI's base64 encoding: little-endian float32 values."""
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")


def decode_base64(text: str) -> list[float]:
    """The floats of a base64 embedding (the inverse of `encode_base64`)."""
    raw = base64.b64decode(text)
    return list(struct.unpack(f"<{len(raw) // 4}f", raw))


def answered(
    request: Request,
    body: dict[str, Any] | msgspec.Raw,
    *,
    prompt_tokens: int,
    completion_tokens: int = 0,
    latency_s: float,
) -> Outcome:
    """A successful outcome (200): `body` answers `request`."""
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


def refused(request: Request, code: str, message: str, latency_s: float = 0.0) -> Outcome:
    """The outcome of a request the engine refuses as written: a 400 no retry can fix."""
    return failure(request, code, message, status_code=400, retryable=False, latency_s=latency_s)


# -- shapes ---------------------------------------------------------------------------------------


def _chat_choice(index: int, choice: Choice, reasoning: bool = False) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": choice.text, "refusal": None}
    if choice.tool_calls:
        message["tool_calls"] = list(choice.tool_calls)
        message["content"] = choice.text or None
    if reasoning:
        # vLLM's field (older vLLM and DeepSeek's API called it reasoning_content), null when
        # the answer holds none; content is null when the answer was all reasoning, as vLLM's
        # server sends them.
        message["reasoning"] = choice.reasoning
        message["content"] = choice.text or None
    return {
        "index": index,
        "message": message,
        "logprobs": None if choice.logprobs is None else chat_logprobs(choice.logprobs),
        "finish_reason": choice.finish_reason,
    }


def chat_logprobs(tokens: Sequence[TokenLogprob]) -> dict[str, Any]:
    """A chat choice's `logprobs`: OpenAI's ChoiceLogprobs."""
    return {
        "content": [
            {
                "token": t.token,
                "logprob": _clamp(t.logprob),
                "bytes": _bytes(t.token_bytes),
                "top_logprobs": [
                    {"token": tok, "logprob": _clamp(lp), "bytes": _bytes(raw)}
                    for tok, raw, lp in t.top
                ],
            }
            for t in tokens
        ],
        "refusal": None,
    }


def completion_logprobs(tokens: Sequence[TokenLogprob]) -> dict[str, Any]:
    """A completion choice's `logprobs`: the legacy shape (parallel lists, top as dicts).

    `text_offset` counts characters into the choice's text; `top_logprobs` maps each candidate's
    text to its logprob (candidates with the same text keep the likelier one), and holds the
    sampled token too, as OpenAI's does (so up to `logprobs` + 1 entries).
    """
    offsets: list[int] = []
    offset = 0
    top: list[dict[str, float]] = []
    for t in tokens:
        offsets.append(offset)
        offset += len(t.token)
        entry: dict[str, float] = {}
        for tok, _, lp in t.top:
            entry.setdefault(tok, _clamp(lp))
        entry.setdefault(t.token, _clamp(t.logprob))
        top.append(entry)
    return {
        "tokens": [t.token for t in tokens],
        "token_logprobs": [_clamp(t.logprob) for t in tokens],
        "top_logprobs": top,
        "text_offset": offsets,
    }


def _clamp(logprob: float) -> float:
    if math.isnan(logprob):
        return MIN_LOGPROB
    return max(float(logprob), MIN_LOGPROB)


def _bytes(raw: bytes | None) -> list[int] | None:
    return None if raw is None else list(raw)
