"""The rules of a /v1/score or /v1/rerank body (vLLM's scoring APIs): the texts and their options.

The field names are vLLM's (entrypoints/pooling/scoring/protocol.py). A score request pairs two
sides, named `text_1`/`text_2`, `queries`/`documents`, `queries`/`items` or `data_1`/`data_2`
(vLLM takes any of the four), each a string or an array of strings, paired 1:1, 1:N or N:N; a
rerank request ranks `documents` against one `query`. Both take vLLM's truncation fields and
`use_activation`; its fields that batchrun cannot honour are refused by name, and so is any field
neither API has (a typo such as `text1` would otherwise become a "missing" error).
"""

from __future__ import annotations

from typing import Any

from batchrun.openai.fields import FieldCheck, check_bool, check_string, int_in, refuse
from batchrun.openai.invalid import bad, describe, show
from batchrun.openai.records import RERANK_URLS

# The texts one side of a request may hold, as an embeddings request's inputs: each is one
# vLLM request, and a line should not flood the engine on its own.
MAX_SCORE_TEXTS = 2048
# The ways a score request names its two sides, in vLLM's order of precedence.
SCORE_PAIRS = (
    ("text_1", "text_2"),
    ("queries", "documents"),
    ("queries", "items"),
    ("data_1", "data_2"),
)
_SCORE_INPUTS = ("text_1", "text_2", "queries", "documents", "items", "data_1", "data_2")
_PAIR_NAMES = "text_1 and text_2, queries and documents, queries and items, or data_1 and data_2"
TRUNCATION_SIDES = ("left", "right")


def check_scoring(url: str, body: dict[str, Any]) -> None:
    """Raise unless `body` is a valid score (or, for a rerank url, rerank) request's inputs.

    Its other fields' values are checked by SCORING_CHECKS / RERANK_CHECKS.
    """
    rerank = url in RERANK_URLS
    known = _RERANK_FIELDS if rerank else _SCORE_FIELDS
    for key, value in body.items():
        if key not in known and value is not None:
            bad(f"body.{key} is not a field of a {url} request; remove it")
    if rerank:
        _check_rerank(body)
    else:
        first, second = score_pair(body)
        n1, n2 = len(_texts(body, first)), len(_texts(body, second))
        if n1 > 1 and n1 != n2:
            bad(
                f"body.{first} holds {n1} texts and body.{second} {n2}: pairs are 1:1, 1:N or "
                f"N:N, so body.{first} must hold one text or as many as body.{second}"
            )


def score_pair(body: dict[str, Any]) -> tuple[str, str]:
    """The two fields a score body names its sides with (raises unless exactly one pair)."""
    present = tuple(k for k in _SCORE_INPUTS if body.get(k) is not None)
    if present in SCORE_PAIRS:
        return present[0], present[1]
    if not present:
        bad(f"body must hold the texts to score: {_PAIR_NAMES}")
    if len(present) == 1:
        (key,) = present
        partner = next(b if key == a else a for a, b in SCORE_PAIRS if key in (a, b))
        alt = " (or body.items)" if key == "queries" else ""
        bad(
            f"body.{key} needs body.{partner}{alt}: the texts of one are scored against the "
            "texts of the other"
        )
    names = [f"body.{k}" for k in present]
    listed = ", ".join(names[:-1]) + " and " + names[-1]
    bad(f"{listed} mix two ways of naming the texts; give one pair: {_PAIR_NAMES}")


def _check_rerank(body: dict[str, Any]) -> None:
    if body.get("query") is None:
        bad("body.query is missing; a rerank request ranks body.documents against it")
    query = body["query"]
    if not isinstance(query, str):
        bad(f"body.query must be a string, got {describe(query)}{_multimodal(query)}")
    if not query:
        bad("body.query must not be empty")
    if body.get("documents") is None:
        bad("body.documents is missing; a rerank request ranks them against body.query")
    _texts(body, "documents")


def _texts(body: dict[str, Any], key: str) -> list[str]:
    """A side's texts (raises unless a non-empty string or array of them)."""
    value = body[key]
    if isinstance(value, str):
        if not value:
            bad(f"body.{key} must not be empty")
        return [value]
    if not isinstance(value, list):
        bad(
            f"body.{key} must be a string or an array of strings, got {describe(value)}"
            f"{_multimodal(value)}"
        )
    if not value:
        bad(f"body.{key} must not be an empty array")
    if len(value) > MAX_SCORE_TEXTS:
        bad(f"body.{key} may hold at most {MAX_SCORE_TEXTS} texts, got {len(value)}")
    for i, item in enumerate(value):
        if not isinstance(item, str):
            bad(f"body.{key}[{i}] must be a string, got {describe(item)}{_multimodal(item)}")
        if not item:
            bad(f"body.{key}[{i}] must not be empty")
    return value


def _multimodal(value: object) -> str:
    """What to add when a text is vLLM's multimodal input ({"content": [...]})."""
    if isinstance(value, dict) and "content" in value:
        return " (multimodal content is not scored: batchrun runs text models)"
    return ""


def scoring_texts(url: str, body: dict[str, Any]) -> tuple[tuple[str, str], list[str], list[str]]:
    """A valid score or rerank body's two sides: their field names, and their texts."""
    if url in RERANK_URLS:
        documents = body["documents"]
        docs = [documents] if isinstance(documents, str) else list(documents)
        return ("query", "documents"), [body["query"]], docs
    first, second = score_pair(body)
    return (first, second), _as_list(body[first]), _as_list(body[second])


def _as_list(value: str | list[str]) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def _check_truncate(key: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not (value == -1 or value >= 1):
        bad(f"body.{key} must be -1 (the model's context length) or at least 1, got {show(value)}")


def _check_side(key: str, value: object) -> None:
    if value not in TRUNCATION_SIDES:
        bad(f"body.{key} must be 'left' or 'right', got {show(value)}")


_NO_TEMPLATE = "it is rendered by a score template, which batchrun does not load"

SCORING_CHECKS: dict[str, FieldCheck] = {
    "user": check_string,
    "truncate_prompt_tokens": _check_truncate,
    "truncation_side": _check_side,
    "max_tokens_per_query": int_in(0, None),
    "max_tokens_per_doc": int_in(0, None),
    "use_activation": check_bool,
    "padding": refuse("batchrun does not pad prompts"),
    "request_id": refuse("a batch line is named by its custom_id"),
    "priority": refuse("batchrun orders a job's requests itself"),
    "mm_processor_kwargs": refuse("batchrun scores text, with no multimodal processor"),
    "cache_salt": refuse("batchrun does not salt vLLM's prefix cache"),
    "instruction": refuse(_NO_TEMPLATE),
    "chat_template_kwargs": refuse(_NO_TEMPLATE),
}
RERANK_CHECKS: dict[str, FieldCheck] = {**SCORING_CHECKS, "top_n": int_in(0, None)}
_SCORE_FIELDS = frozenset({"model", *_SCORE_INPUTS, *SCORING_CHECKS})
_RERANK_FIELDS = frozenset({"model", "query", "documents", *RERANK_CHECKS})
