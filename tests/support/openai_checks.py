"""Checks shared by the fidelity tests: parse a body with the openai package's own types, in strict
mode and with no field the type lacks, and compare what came back with what the request asked for.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from openai import BaseModel
from openai.types import Completion, CreateEmbeddingResponse
from openai.types.chat import ChatCompletion

from batchrun.openai.records import CHAT, COMPLETIONS, EMBEDDINGS
from batchrun.openai.response_bodies import decode_base64

TYPES: dict[str, type[BaseModel]] = {
    CHAT: ChatCompletion,
    COMPLETIONS: Completion,
    EMBEDDINGS: CreateEmbeddingResponse,
}


def assert_no_extra(obj: object, path: str = "body") -> None:
    """Fail if any object in `obj` holds a field its openai type does not define.

    The openai types accept unknown fields (extra="allow"), so strict parsing alone would let
    a misspelt or invented field through.
    """
    if isinstance(obj, BaseModel):
        assert not obj.model_extra, f"{path} has fields the openai type lacks: {obj.model_extra}"
        for name in type(obj).model_fields:
            assert_no_extra(getattr(obj, name), f"{path}.{name}")
    elif isinstance(obj, list):
        for i, item in enumerate(obj):
            assert_no_extra(item, f"{path}[{i}]")
    elif isinstance(obj, dict):
        for key, item in obj.items():
            assert_no_extra(item, f"{path}.{key}")


def parse_body(url: str, body: dict[str, Any]) -> Any:
    """The body as its openai type, parsed strictly (no coercion) and with no unknown field.

    A base64 embedding is a string on the wire, as OpenAI sends it; the openai package decodes it
    client-side before it fills `Embedding.embedding: List[float]`, so it is decoded here too.
    """
    if url == EMBEDDINGS:
        body = copy.deepcopy(body)
        for item in body["data"]:
            if isinstance(item["embedding"], str):
                item["embedding"] = decode_base64(item["embedding"])
    parsed = TYPES[url].model_validate(body, strict=True)
    assert_no_extra(parsed)
    return parsed


def embedding_inputs(value: Any) -> list[Any]:
    """An embeddings request's `input` as a list of items."""
    if isinstance(value, str):
        return [value]
    if value and isinstance(value[0], int):
        return [value]
    return list(value)


def check_against_request(url: str, request: dict[str, Any], parsed: Any) -> None:
    """Compare a parsed body with its request: model, n, token bounds, stop, logprobs, metadata."""
    assert parsed.model == request.get("model"), "the model the request asked for is reported"
    if url == EMBEDDINGS:
        inputs = embedding_inputs(request["input"])
        assert [d.index for d in parsed.data] == list(range(len(inputs)))
        assert parsed.usage.prompt_tokens == parsed.usage.total_tokens > 0
        return
    n = request.get("n") or 1
    assert [c.index for c in parsed.choices] == list(range(n))
    usage = parsed.usage
    assert usage is not None
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    limit = request.get("max_completion_tokens") or request.get("max_tokens")
    if url == COMPLETIONS and limit is None:
        limit = 16  # the legacy Completions API's default
    if limit is not None:
        assert usage.completion_tokens <= n * limit
    stops = request.get("stop")
    stops = [stops] if isinstance(stops, str) else stops or []
    for choice in parsed.choices:
        text = choice.message.content if url == CHAT else choice.text
        assert isinstance(text, str)
        if url == COMPLETIONS and request.get("echo"):
            prompt = request["prompt"]
            assert text.startswith(prompt if isinstance(prompt, str) else prompt[0])
        for stop in stops:
            assert stop not in text, f"stop sequence {stop!r} in {text!r}"
        _check_logprobs(url, request, choice, text)
    if url == CHAT:
        assert parsed.metadata == request.get("metadata")


def _check_logprobs(url: str, request: dict[str, Any], choice: Any, text: str) -> None:
    if url == CHAT:
        wanted = request.get("logprobs") is True
        top = request.get("top_logprobs") or 0
        if not wanted:
            assert choice.logprobs is None
            return
        assert choice.logprobs is not None and choice.logprobs.content is not None
        for token in choice.logprobs.content:
            assert token.logprob <= 0
            assert len(token.top_logprobs) <= top
            assert all(t.logprob <= 0 for t in token.top_logprobs)
            # Most likely first.
            lps = [t.logprob for t in token.top_logprobs]
            assert lps == sorted(lps, reverse=True)
        return
    k = request.get("logprobs")
    if k is None:
        assert choice.logprobs is None
        return
    lp = choice.logprobs
    assert lp is not None and lp.tokens is not None
    assert lp.token_logprobs is not None and lp.top_logprobs is not None
    assert lp.text_offset is not None
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset)
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        # The sampled token is always in its position's top_logprobs, so up to k + 1 entries.
        assert 1 <= len(top) <= k + 1
        assert top[token] == logprob


def output_lines(path: Any) -> dict[str, dict[str, Any]]:
    """output.jsonl or errors.jsonl, by custom_id."""
    lines = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]
    return {line["custom_id"]: line for line in lines}


def requests_of(path: Any) -> dict[str, dict[str, Any]]:
    """An input file's request bodies, by custom_id."""
    lines = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]
    return {line["custom_id"]: line["body"] for line in lines}
