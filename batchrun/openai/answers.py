"""What a successful answer of each endpoint holds: the object kind and the parts a reader of
it (export, the openai package's types, a client) indexes into. Batchrun's own builders of
answers (openai/response_bodies.py, responses_api_body.py, scoring_body.py, the engines' audio
answers) make exactly these; an answer from anywhere else (an entry of the answer cache shared
by jobs, a file on disk anyone may edit) is an answer only if it holds them too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from batchrun.openai.records import (
    AUDIO_ENDPOINTS,
    CHAT,
    COMPLETIONS,
    EMBEDDINGS,
    RERANK_URLS,
    RESPONSES,
    SCORE_URLS,
)

# The `object` field of each endpoint's answer (the speech-to-text and rerank answers have none).
_OBJECTS = {
    CHAT: "chat.completion",
    COMPLETIONS: "text_completion",
    EMBEDDINGS: "list",
    RESPONSES: "response",
    **dict.fromkeys(SCORE_URLS, "list"),
}


def answer_problem(url: str, body: object) -> str | None:
    """What keeps `body` from being a successful answer of endpoint `url`; None when it is one."""
    if not isinstance(body, dict):
        return "the answer is not a JSON object"
    wanted = _OBJECTS.get(url)
    if wanted is not None and body.get("object") != wanted:
        return f"its object is {body.get('object')!r}, not {wanted!r}"
    if url == CHAT:
        return _items(body, "choices", lambda c: _index(c) and isinstance(c.get("message"), dict))
    if url == COMPLETIONS:
        return _items(body, "choices", lambda c: _index(c) and isinstance(c.get("text"), str))
    if url == EMBEDDINGS:
        return _items(body, "data", lambda d: isinstance(d.get("embedding"), list | str))
    if url in SCORE_URLS:
        return _items(body, "data", lambda d: isinstance(d.get("score"), int | float))
    if url in RERANK_URLS:
        return _items(body, "results", _relevance, empty=True)
    if url == RESPONSES:  # a reasoning item, a message, or both: never none
        return _items(body, "output", lambda item: isinstance(item.get("type"), str))
    if url in AUDIO_ENDPOINTS:
        return None if isinstance(body.get("text"), str) else "it has no text"
    return None


def _index(choice: dict[str, Any]) -> bool:
    return type(choice.get("index")) is int


def _relevance(result: dict[str, Any]) -> bool:
    return isinstance(result.get("relevance_score"), int | float)


def _items(
    body: dict[str, Any],
    part: str,
    good: Callable[[dict[str, Any]], bool],
    *,
    empty: bool = False,
) -> str | None:
    """Whether body[part] is a list (non-empty unless `empty`) of objects that are each `good`."""
    items = body.get(part)
    if not isinstance(items, list) or (not items and not empty):
        return f"it has no {part}"
    if not all(isinstance(item, dict) and good(item) for item in items):
        return f"its {part} are not all well-formed"
    return None
