"""The records that flow through batchrun: validated requests, bad input lines, attempt outcomes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
EMBEDDINGS = "/v1/embeddings"
# OpenAI's Responses API (batchrun.openai.responses_api; its bodies: responses_api_body).
RESPONSES = "/v1/responses"
# vLLM's scoring APIs (batchrun.openai.scoring). vLLM's server answers them with and without the
# /v1 prefix, and its run-batch takes either, so both spellings are accepted; a file still uses
# one url on every line.
SCORE = "/v1/score"
RERANK = "/v1/rerank"
SCORE_URLS = (SCORE, "/score")
RERANK_URLS = (RERANK, "/rerank", "/v2/rerank")  # vLLM's server routes all three
SCORING_URLS = (*SCORE_URLS, *RERANK_URLS)
# The endpoints a pooling model answers: vLLM starts the model with its pooling runner for them,
# and one such engine answers all of them.
POOLING_ENDPOINTS = (EMBEDDINGS, *SCORING_URLS)
# vLLM's speech-to-text endpoints, in its batch format (body.file_url; batchrun.openai.audio).
TRANSCRIPTIONS = "/v1/audio/transcriptions"
TRANSLATIONS = "/v1/audio/translations"
AUDIO_ENDPOINTS = (TRANSCRIPTIONS, TRANSLATIONS)
SUPPORTED_ENDPOINTS = (CHAT, COMPLETIONS, EMBEDDINGS, RESPONSES, *SCORING_URLS, *AUDIO_ENDPOINTS)


class Request(msgspec.Struct, frozen=True):
    """One valid input line: an OpenAI batch request with its 1-based line number.

    A msgspec Struct, not a frozen dataclass: the parent makes one per line in each pass over
    the input, and requests cross to the workers by the hundred thousand; a Struct is made in
    half the time (a frozen dataclass sets each field through object.__setattr__) and pickles
    by its fields in order, unpickled in under half the time.
    """

    custom_id: str
    line: int
    url: str
    body: dict[str, Any]


@dataclass(frozen=True, slots=True)
class LineError:
    """An input line that failed validation; it becomes an error record, the job goes on."""

    line: int
    custom_id: str | None
    code: str
    message: str


class Outcome(msgspec.Struct, gc=False):
    """The result of one attempt at one request, as an engine reports it.

    `body` is the response object (ChatCompletion, Completion, CreateEmbeddingResponse, or vLLM's
    ScoreResponse / RerankResponse, as a dict) when `ok`; a worker process sends it on as its JSON (a `msgspec.Raw`, see
    journal.encode_body), which the journal writes as it is. An embeddings body holds its
    vectors as base64 float32, marked when its request asked for floats (openai/vectors.py);
    export writes it as asked;
    `error` is `{"code": ..., "message": ...}` when not. `retryable` is False for failures that
    would fail the same way again (a bad request), True for engine failures.

    A msgspec Struct: an engine makes one per request and they cross back to the parent in
    bulk, where the parent's one thread unpickles them; a Struct is made and unpickled in about
    half a dataclass's time. Not tracked by the cyclic garbage collector (gc=False): an outcome
    refers to plain values, bodies and dicts, never back to itself.
    """

    custom_id: str
    ok: bool
    status_code: int
    body: dict[str, Any] | msgspec.Raw | None = None
    error: dict[str, str] | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0
    retryable: bool = False
    extra: dict[str, Any] = msgspec.field(default_factory=dict)
    # Seconds from entering the engine to the first token, where the engine reports it (vLLM's
    # RequestOutput.metrics); None elsewhere. Not journaled: /metrics exports it.
    ttft_s: float | None = None
    # An embeddings body's vectors as float32 bytes, taken out of `body` by the worker
    # (openai/vectors.py split_vectors: each embedding there an empty text, in order): the
    # journal keeps them once, as binary, in its side file (job/vectors.py). None: `body` is whole.
    vectors: list[bytes] | None = None
    # Where a worker wrote `body` and `vectors` itself (job/shards.py): ``[shard, at, body
    # bytes, vector bytes...]``, both then None. None: they travel here.
    stored: list[str | int] | None = None
