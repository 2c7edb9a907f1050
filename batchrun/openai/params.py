"""A validated request's parameters as typed objects: what every engine reads, defined once.

Validation (batchrun.openai.validation) has already refused every value outside its rules, so
these readers only take values apart; they never judge them. Both engines (echo and vLLM) build
their work from these objects, never from the body, so a field means the same thing to each.

Why not carried from validation in the Request: the run pass reads its requests again from the
input file (memory stays flat at millions of lines), and typed objects pickled to the workers
would cost the parent more than reading a handful of keys costs the worker.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from batchrun.openai.embeddings import embedding_inputs
from batchrun.openai.records import CHAT, COMPLETIONS, RERANK_URLS, RESPONSES, Request
from batchrun.openai.scoring import scoring_texts
from batchrun.openai.toolchoice import ForcedCall, forced_call, is_forced
from batchrun.openai.vllm_sampling import VllmSampling, vllm_sampling

# A completions request without max_tokens generates 16 tokens, as OpenAI's legacy API does.
COMPLETIONS_DEFAULT_MAX_TOKENS = 16


class OutputFormat(msgspec.Struct, frozen=True):
    """A `response_format` that constrains the output: any JSON object, or one JSON Schema."""

    kind: Literal["json_object", "json_schema"]
    schema: dict[str, Any] | None = None  # None with json_schema: any JSON object


class Sampling(msgspec.Struct, frozen=True):
    """The generation fields of a chat or completions request, with OpenAI's defaults."""

    n: int = 1
    # None: up to the model's context window (chat without max_(completion_)tokens).
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    # How many top logprobs per token; None when no logprobs were asked for at all.
    logprobs: int | None = None
    logit_bias: dict[int, float] | None = None
    output_format: OutputFormat | None = None
    # Completions' `echo`: the prompt is returned before the completion.
    echo: bool = False
    # Tools were given and may be called: the answer is parsed for tool calls.
    tools: bool = False
    # tool_choice forces a call: the answer is constrained to it (and read back as calls).
    forced_call: ForcedCall | None = None
    # vLLM's sampling extensions, when the body sets any (openai/vllm_sampling.py).
    vllm: VllmSampling | None = None


class EmbeddingParams(msgspec.Struct, frozen=True):
    """The fields of an embeddings request: its inputs and the vector size asked for."""

    inputs: list[str | list[int]]
    # `input` was one string (not an array): errors name body.input, not body.input[0].
    single: bool = False
    dimensions: int | None = None
    encoding_format: Literal["float", "base64"] = "float"


class ScoreParams(msgspec.Struct, frozen=True):
    """The fields of a score or rerank request: the texts of its two sides and their options.

    Pairs are 1:1, 1:N or N:N: with one query, every document is scored against it; else
    query i against document i (validation made the counts agree).
    """

    queries: list[str]
    documents: list[str]
    # The body's names of the two sides (text_1/text_2, queries/documents, ...; rerank:
    # query/documents) and whether each was one string: what error messages name.
    names: tuple[str, str] = ("text_1", "text_2")
    single: tuple[bool, bool] = (False, False)
    rerank: bool = False
    # Rerank: how many of the best results to return; None returns them all.
    top_n: int | None = None
    # vLLM's truncation: None none, -1 to the model's context length, else to that many tokens.
    truncate_prompt_tokens: int | None = None
    truncation_side: Literal["left", "right"] | None = None
    # Each query / document cut to this many tokens first (0: not cut).
    max_tokens_per_query: int = 0
    max_tokens_per_doc: int = 0
    use_activation: bool | None = None

    def pairs(self) -> list[tuple[int, int]]:
        """(query index, document index) of each pair, in the order of the scores."""
        one = len(self.queries) == 1
        return [(0 if one else i, i) for i in range(len(self.documents))]


def context_exceeded(prompt_tokens: int, max_tokens: int | None, max_model_len: int) -> str | None:
    """Why a prompt of `prompt_tokens` plus `max_tokens` (unset: at least one) does not fit a
    context of `max_model_len` tokens (a context_length_exceeded 400), or None when it fits."""
    needed = max_tokens if max_tokens is not None else 1
    if prompt_tokens + needed <= max_model_len:
        return None
    asked = f"{max_tokens} completion tokens" if max_tokens is not None else "1 token"
    return (
        f"this model's maximum context length is {max_model_len} tokens; the prompt "
        f"has {prompt_tokens} tokens and {asked} were requested"
    )


def sampling(request: Request) -> Sampling:
    """The typed generation parameters of a validated chat, completions or responses request.

    A /v1/responses body has max_output_tokens and text.format, and no n, logprobs, echo or
    tools; its other fields are chat's (vLLM's Responses endpoint takes seed, stop, penalties
    and logit_bias beyond OpenAI's API)."""
    body = request.body
    url = request.url
    chat = url == CHAT
    # The optional fields read inline, not through _or and the helpers: an engine reads every
    # request's, and most bodies set few of them (a null is "not set", as in _or).
    get = body.get
    if url == RESPONSES:
        max_tokens, logprobs, n = get("max_output_tokens"), None, None
        output_format = _responses_format(get("text"))
    else:
        if chat:
            # max_completion_tokens replaced max_tokens in the chat API; either is honoured.
            max_tokens = get("max_completion_tokens")
            if max_tokens is None:
                max_tokens = get("max_tokens")
            top = get("top_logprobs")
            logprobs = (top or 0) if get("logprobs") is True else None
        else:
            max_tokens = get("max_tokens")
            if max_tokens is None and url == COMPLETIONS:
                max_tokens = COMPLETIONS_DEFAULT_MAX_TOKENS
            logprobs = get("logprobs")
        n, output = get("n"), get("response_format")
        output_format = _output_format(output) if output is not None else None
    stop = get("stop")
    tool_choice = get("tool_choice")
    forced = forced_call(body) if chat and is_forced(tool_choice) else None
    temperature, top_p = get("temperature"), get("top_p")
    presence, frequency = get("presence_penalty"), get("frequency_penalty")
    bias = get("logit_bias")
    return Sampling(
        n=1 if n is None else n,
        max_tokens=max_tokens,
        temperature=1.0 if temperature is None else float(temperature),
        top_p=1.0 if top_p is None else float(top_p),
        presence_penalty=0.0 if presence is None else float(presence),
        frequency_penalty=0.0 if frequency is None else float(frequency),
        seed=get("seed"),
        stop=(stop,) if isinstance(stop, str) else tuple(stop or ()),
        logprobs=logprobs,
        logit_bias=_logit_bias(bias) if bias else None,
        output_format=output_format,
        echo=url == COMPLETIONS and get("echo") is True,
        tools=chat and forced is None and bool(get("tools")) and tool_choice != "none",
        forced_call=forced,
        vllm=vllm_sampling(body),
    )


def _responses_format(text: object) -> OutputFormat | None:
    """A /v1/responses body's text.format as an output constraint (None for text)."""
    fmt = text.get("format") if isinstance(text, dict) else None
    if isinstance(fmt, dict) and fmt.get("type") == "json_object":
        return OutputFormat("json_object")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        return OutputFormat("json_schema", dict(fmt["schema"]))
    return None


def embedding_params(request: Request) -> EmbeddingParams:
    """The typed fields of a validated embeddings request."""
    body = request.body
    return EmbeddingParams(
        inputs=embedding_inputs(body.get("input")),
        single=isinstance(body.get("input"), str),
        dimensions=body.get("dimensions"),
        encoding_format=_or(body.get("encoding_format"), "float"),
    )


def score_params(request: Request) -> ScoreParams:
    """The typed fields of a validated score or rerank request."""
    body = request.body
    names, queries, documents = scoring_texts(request.url, body)
    rerank = request.url in RERANK_URLS
    top_n = body.get("top_n") if rerank else None
    return ScoreParams(
        queries=queries,
        documents=documents,
        names=names,
        single=(isinstance(body[names[0]], str), isinstance(body[names[1]], str)),
        rerank=rerank,
        # vLLM's top_n 0 means every result, as does its absence.
        top_n=top_n or None,
        truncate_prompt_tokens=body.get("truncate_prompt_tokens"),
        truncation_side=body.get("truncation_side"),
        max_tokens_per_query=_or(body.get("max_tokens_per_query"), 0),
        max_tokens_per_doc=_or(body.get("max_tokens_per_doc"), 0),
        use_activation=body.get("use_activation"),
    )


def _or(value: Any, default: Any) -> Any:
    """An optional field: JSON null means "not set", as in the OpenAI API."""
    return default if value is None else value


def _logit_bias(value: object) -> dict[int, float] | None:
    if not isinstance(value, dict) or not value:
        return None
    # Validation made every key a decimal token id and every value a number.
    return {int(token): float(bias) for token, bias in value.items()}


def _output_format(value: object) -> OutputFormat | None:
    if not isinstance(value, dict):
        return None
    kind = value.get("type")
    if kind == "json_object":
        return OutputFormat("json_object")
    if kind == "json_schema":
        spec = value.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        return OutputFormat("json_schema", dict(schema) if isinstance(schema, dict) else None)
    return None  # "text": no constraint
