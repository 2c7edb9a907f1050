"""The token details of a finished batch's `usage`, as OpenAI's Batch object reports them: the
cached prompt tokens and the reasoning tokens, summed over the usage of its answers."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import msgspec


class _Details(msgspec.Struct):
    cached_tokens: int | None = None
    reasoning_tokens: int | None = None


class _Usage(msgspec.Struct):
    # Chat and completions name them so; a Response names them input_/output_tokens_details.
    prompt_tokens_details: _Details | None = None
    completion_tokens_details: _Details | None = None
    input_tokens_details: _Details | None = None
    output_tokens_details: _Details | None = None


class _Body(msgspec.Struct):
    usage: _Usage | None = None


class _Response(msgspec.Struct):
    body: _Body | None = None


class _Line(msgspec.Struct):
    # Only these fields are decoded; the rest of each line (the answers' text) is skipped.
    response: _Response | None = None


@dataclass(frozen=True)
class TokenDetails:
    """Prompt tokens found in the engine's prefix cache, and reasoning tokens, of a batch."""

    cached_tokens: int = 0
    reasoning_tokens: int = 0


def token_details(output: Path) -> TokenDetails:
    """Sum the cached and reasoning tokens of every answer in an OpenAI batch output file."""
    decode = msgspec.json.Decoder(_Line).decode
    cached = reasoning = 0
    try:
        f = output.open("rb")
    except FileNotFoundError:
        return TokenDetails()
    with f:
        for raw in f:
            try:
                line = decode(raw)
            except msgspec.DecodeError:
                # A lone surrogate escape in an answer's text, which json reads and msgspec does
                # not (even in a field it skips).
                try:
                    line = msgspec.convert(json.loads(raw), _Line)
                except (ValueError, msgspec.ValidationError):
                    continue
            usage = line.response.body.usage if line.response and line.response.body else None
            if usage is None:
                continue
            cached += _sum(usage.prompt_tokens_details, usage.input_tokens_details, "cached_tokens")
            reasoning += _sum(
                usage.completion_tokens_details, usage.output_tokens_details, "reasoning_tokens"
            )
    return TokenDetails(cached, reasoning)


def _sum(a: _Details | None, b: _Details | None, name: str) -> int:
    return sum(int(getattr(d, name) or 0) for d in (a, b) if d is not None)
