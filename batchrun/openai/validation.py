"""Per-line rules for OpenAI batch input: the envelope fields and the request body.

Every check here is pure (no file, no state); the reader owns the stateful rules (duplicate
custom_ids, one url per file). A broken rule raises `InvalidLine` with the error code and a
message that names the field and what was expected. Exceptions keep the fast path (a valid line)
free of result-tuple plumbing; they are only raised for bad lines.

This module checks the envelope (custom_id, method, url) and dispatches the body by endpoint:
its rules live in batchrun.openai.chat, .completions, .embeddings, .responses_api and .scoring
(vLLM's /v1/score and /v1/rerank), the field checkers they share in .fields, the lone-surrogate
scan in .text and `InvalidLine` itself in .invalid.

An explicit JSON ``null`` on an optional body field means "not set", as in the OpenAI API, so code
that turns a body into engine parameters must treat ``None`` like an absent key.
"""

from __future__ import annotations

from typing import Any

from batchrun.openai.audio import AUDIO_CHECKS, check_audio_body
from batchrun.openai.chat import CHAT_CHECKS, check_chat_combinations, check_messages
from batchrun.openai.completions import (
    COMPLETION_CHECKS,
    check_completion_combinations,
    check_prompt,
)
from batchrun.openai.embeddings import EMBEDDING_CHECKS, check_input
from batchrun.openai.fields import FieldCheck
from batchrun.openai.invalid import InvalidLine, bad, describe, show
from batchrun.openai.records import (
    AUDIO_ENDPOINTS,
    CHAT,
    COMPLETIONS,
    EMBEDDINGS,
    RERANK_URLS,
    RESPONSES,
    SCORE_URLS,
    SUPPORTED_ENDPOINTS,
)
from batchrun.openai.responses_api import RESPONSES_CHECKS
from batchrun.openai.responses_api import check_input as check_responses_input
from batchrun.openai.scoring import RERANK_CHECKS, SCORING_CHECKS, check_scoring
from batchrun.openai.text import SURROGATE, check_text, surrogate_problem
from batchrun.openai.vllm_sampling import check_min_tokens

MAX_CUSTOM_ID_LEN = 512


def _endpoints() -> str:
    return ", ".join(repr(u) for u in SUPPORTED_ENDPOINTS)


def check_custom_id(obj: dict[str, Any]) -> str:
    """Return the line's custom_id, or raise if it is missing, not a string, empty or too long."""
    if "custom_id" not in obj:
        raise InvalidLine("missing_custom_id", "custom_id is missing; every line needs one")
    cid = obj["custom_id"]
    if not isinstance(cid, str):
        raise InvalidLine("invalid_custom_id", f"custom_id must be a string, got {describe(cid)}")
    if not cid:
        raise InvalidLine("invalid_custom_id", "custom_id must not be empty")
    if len(cid) > MAX_CUSTOM_ID_LEN:
        raise InvalidLine(
            "invalid_custom_id",
            f"custom_id is {len(cid)} characters long, the limit is {MAX_CUSTOM_ID_LEN}: "
            f"{show(cid)}",
        )
    # The custom_id is written to the journal and the outputs, as UTF-8. (isascii() first, as in
    # surrogate_problem, inlined: this runs for every line.)
    if not cid.isascii() and SURROGATE.search(cid) is not None:
        problem = surrogate_problem(cid)
        raise InvalidLine("invalid_custom_id", f"custom_id {show(cid)} {problem}")
    return cid


def check_method(obj: dict[str, Any]) -> None:
    """Raise unless the line's method is "POST"."""
    if "method" not in obj:
        raise InvalidLine("invalid_method", 'method is missing; expected "POST"')
    method = obj["method"]
    if method != "POST":
        raise InvalidLine("invalid_method", f'method must be "POST", got {show(method)}')


# Endpoints OpenAI's Batch API takes that no local text model can serve (the url itself, or one
# below it: /v1/images/generations, /v1/audio/speech), and what each needs instead.
_UNSERVABLE = (
    ("/v1/moderations", "a moderation classifier"),
    ("/v1/images", "an image generation model"),
    ("/v1/videos", "a video generation model"),
    ("/v1/audio/speech", "a speech synthesis model"),
)


def _unservable(url: str) -> str | None:
    """What an OpenAI Batch API endpoint that batchrun cannot serve needs; None for others."""
    for endpoint, needs in _UNSERVABLE:
        if url == endpoint or url.startswith(endpoint + "/"):
            return needs
    return None


def check_url(obj: dict[str, Any]) -> str:
    """Return the line's url, or raise unless it is one of the supported endpoints."""
    if "url" not in obj:
        raise InvalidLine("invalid_url", f"url is missing; expected one of {_endpoints()}")
    url = obj["url"]
    if not isinstance(url, str) or url not in SUPPORTED_ENDPOINTS:
        needs = _unservable(url) if isinstance(url, str) else None
        if needs is not None:
            # A real OpenAI batch file, not a typo: say why it cannot run here.
            raise InvalidLine(
                "invalid_url",
                f"url {show(url)} is an OpenAI Batch API endpoint that batchrun cannot serve: "
                f"it needs {needs}, and batchrun runs local chat, embedding and speech-to-text "
                "models; "
                f"supported are {_endpoints()}",
            )
        raise InvalidLine("invalid_url", f"url must be one of {_endpoints()}, got {show(url)}")
    return url


def check_body(url: str, obj: dict[str, Any], *, scan_text: bool = True) -> dict[str, Any]:
    """Return the line's body, or raise if it breaks a rule of the endpoint `url`.

    `scan_text` False skips the search for lone surrogates: for a caller (the reader) that saw
    the line's raw text hold no surrogate escape, so none of its strings can hold one.
    """
    if "body" not in obj:
        raise InvalidLine("invalid_body", "body is missing; expected a JSON object")
    body = obj["body"]
    if not isinstance(body, dict):
        raise InvalidLine("invalid_body", f"body must be a JSON object, got {describe(body)}")
    if url == CHAT:
        check_messages(body)
    elif url == COMPLETIONS:
        check_prompt(body)
    elif url == EMBEDDINGS:
        check_input(body)
    elif url == RESPONSES:
        check_responses_input(body)
    elif url in AUDIO_ENDPOINTS:
        check_audio_body(body)
    else:
        check_scoring(url, body)
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        bad(f"body.model must be a string, got {describe(model)}")
    checks = _FIELD_CHECKS[url]
    # Only the keys present are looked at: a body usually has a few of the known fields.
    for key, value in body.items():
        check = checks.get(key)
        if check is not None and value is not None:
            check(key, value)
    if url == CHAT:
        check_chat_combinations(body)
    elif url == COMPLETIONS:
        check_completion_combinations(body)
    elif url == RESPONSES:
        check_min_tokens(body, body.get("max_output_tokens"))
    if scan_text:
        # Last: a line with a structural mistake gets that field's own message first.
        check_text(body)
    return body


_FIELD_CHECKS: dict[str, dict[str, FieldCheck]] = {
    CHAT: CHAT_CHECKS,
    COMPLETIONS: COMPLETION_CHECKS,
    EMBEDDINGS: EMBEDDING_CHECKS,
    RESPONSES: RESPONSES_CHECKS,
    **dict.fromkeys(SCORE_URLS, SCORING_CHECKS),
    **dict.fromkeys(RERANK_URLS, RERANK_CHECKS),
    **dict.fromkeys(AUDIO_ENDPOINTS, AUDIO_CHECKS),
}
