"""The token details of a finished batch's `usage`, as OpenAI's Batch object reports them: the
cached prompt tokens and the reasoning tokens, summed over the usage of its answers."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import msgspec

from batchrun.openai.usage import DetailedUsage


class _Body(msgspec.Struct):
    usage: DetailedUsage | None = None


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
            cached += usage.cached_tokens()
            reasoning += usage.reasoning_tokens()
    return TokenDetails(cached, reasoning)
