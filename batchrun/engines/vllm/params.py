"""A request body's OpenAI sampling fields as vLLM `SamplingParams`: the number fields, stop,
logprobs, logit bias and `response_format` (as structured outputs), with `max_tokens` checked
against the context window. A field that cannot be honoured is a BadRequest (a 400 outcome).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from batchrun.engines.vllm.errors import BadRequest
from batchrun.openai.records import CHAT, Request


def sampling_params(
    request: Request, prompt_tokens: int, *, max_model_len: int, vocab_size: int
) -> Any:
    """Build vLLM SamplingParams from the body's OpenAI sampling fields."""
    from vllm.exceptions import VLLMClientError
    from vllm.sampling_params import RequestOutputKind, SamplingParams

    body = request.body
    remaining = max_model_len - prompt_tokens
    if request.url == CHAT:
        # max_completion_tokens replaced max_tokens in the chat API; honour either.
        max_tokens = int_field(body, "max_completion_tokens")
        if max_tokens is None:
            max_tokens = int_field(body, "max_tokens")
    else:
        max_tokens = int_field(body, "max_tokens", default=16)
    needed = max_tokens if max_tokens is not None else 1
    if prompt_tokens + needed > max_model_len:
        asked = f"{max_tokens} completion tokens" if max_tokens is not None else "1 token"
        raise BadRequest(
            f"this model's maximum context length is {max_model_len} tokens; the prompt "
            f"has {prompt_tokens} tokens and {asked} were requested",
            code="context_length_exceeded",
        )
    n = int_field(body, "n")
    try:
        return SamplingParams(
            n=n if n is not None else 1,
            temperature=_float_field(body, "temperature", 1.0),
            top_p=_float_field(body, "top_p", 1.0),
            presence_penalty=_float_field(body, "presence_penalty", 0.0),
            frequency_penalty=_float_field(body, "frequency_penalty", 0.0),
            seed=int_field(body, "seed"),
            stop=_stop_field(body.get("stop")),
            max_tokens=max_tokens if max_tokens is not None else remaining,
            logprobs=logprobs_field(request),
            logit_bias=_logit_bias(body.get("logit_bias"), vocab_size),
            structured_outputs=_structured_outputs(body.get("response_format")),
            # Only the final output of each request is wanted: no per-token RequestOutputs.
            output_kind=RequestOutputKind.FINAL_ONLY,
        )
    except (ValueError, TypeError, VLLMClientError) as exc:
        raise BadRequest(str(exc)) from exc


def _logit_bias(value: object, vocab_size: int) -> dict[int, float] | None:
    """`logit_bias` with int token ids; an id outside the vocabulary is a 400."""
    if not isinstance(value, Mapping) or not value:
        return None
    bias: dict[int, float] = {}
    for key, weight in value.items():
        try:
            token = int(key)
        except (TypeError, ValueError):
            raise BadRequest(f"body.logit_bias key {key!r} is not a token id") from None
        if not 0 <= token < vocab_size:
            raise BadRequest(
                f"body.logit_bias names token id {token}, outside this model's vocabulary "
                f"(ids 0 to {vocab_size - 1})"
            )
        bias[token] = float(weight)
    return bias


def logprobs_field(request: Request) -> int | None:
    """How many top logprobs vLLM must return per token, or None when none were asked for.

    Chat asks with `logprobs: true` (+ `top_logprobs`), completions with `logprobs: <int>`.
    """
    body = request.body
    if request.url == CHAT:
        if body.get("logprobs") is not True:
            return None
        return int_field(body, "top_logprobs", default=0)
    return int_field(body, "logprobs")


def _structured_outputs(response_format: object) -> Any:
    """vLLM's structured output constraint for an OpenAI `response_format` (None for text)."""
    if not isinstance(response_format, Mapping):
        return None
    from vllm.sampling_params import StructuredOutputsParams

    kind = response_format.get("type")
    if kind == "json_object":
        return StructuredOutputsParams(json_object=True)
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, Mapping) else None
        if schema is None:
            return StructuredOutputsParams(json_object=True)  # no schema: any JSON object
        return StructuredOutputsParams(json=dict(schema))
    return None


def capped_max_model_len(probe: Any, wanted: int) -> int:
    """`wanted`, capped at the model's own limit when the model runs as a pooling model.

    Embedding models are small-context (all-MiniLM-L6-v2: 256 tokens) and vLLM refuses a larger
    `max_model_len` at start-up; batchrun's default of 2048 is meant for generative models.
    `probe` is an EngineArgs without max_model_len: its model config derives the model's limit.
    """
    try:
        config = probe.create_model_config()
    except Exception:
        return wanted  # the real start-up reports what is wrong
    if config.runner_type == "pooling":
        return min(wanted, int(config.max_model_len))
    return wanted


def int_field(body: Mapping[str, Any], key: str, default: int | None = None) -> int | None:
    """An optional integer field (null means the default)."""
    value = body.get(key)
    if value is None:
        return default
    # JSON has one number type: accept 3.0 for 3, refuse 3.5 and booleans.
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise BadRequest(f"`{key}` must be an integer, got {value!r}")
    return value


def _float_field(body: Mapping[str, Any], key: str, default: float) -> float:
    """An optional number field (null means the default)."""
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise BadRequest(f"`{key}` must be a number, got {value!r}")
    return float(value)


def _stop_field(value: object) -> list[str] | None:
    """`stop`: null, a string, or a list of strings."""
    if value is None:
        return None
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return list(value)
    raise BadRequest("`stop` must be a string or a list of strings")
