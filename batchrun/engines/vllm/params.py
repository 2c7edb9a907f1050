"""A request's typed sampling fields (batchrun.openai.params) as vLLM `SamplingParams`, with
`max_tokens` checked against the context window and every token id a body names (logit_bias,
allowed_token_ids, stop_token_ids) against the vocabulary. What vLLM cannot honour is a
BadRequest (a 400 outcome).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from batchrun.engines.vllm.errors import BadRequest
from batchrun.openai.params import Sampling, context_exceeded
from batchrun.openai.token_ids import outside_vocab
from batchrun.openai.vllm_sampling import VllmSampling

_NO_EXTENSIONS = VllmSampling()  # vLLM's own defaults: a body that sets none of them


def sampling_params(
    params: Sampling,
    prompt_tokens: int,
    *,
    max_model_len: int,
    vocab_size: int,
    default_max_tokens: int | None = None,
) -> Any:
    """Build vLLM SamplingParams from a request's typed sampling fields. `default_max_tokens`:
    the model's own limit for a request that sets none (engines/vllm/model_defaults.py)."""
    max_tokens = params.max_tokens
    too_long = context_exceeded(prompt_tokens, max_tokens, max_model_len)
    if too_long is not None:
        raise BadRequest(too_long, code="context_length_exceeded")
    if max_tokens is None:  # the rest of the context, or less where the model says so (as vLLM)
        max_tokens = max_model_len - prompt_tokens
        if default_max_tokens is not None:
            max_tokens = min(max_tokens, default_max_tokens)
    ext = params.vllm or _NO_EXTENSIONS
    allowed = ext.allowed_token_ids
    # Every token id a body names, in one form (vLLM's own words differ field by field).
    _in_vocab("logit_bias", params.logit_bias or (), vocab_size)
    _in_vocab("allowed_token_ids", allowed or (), vocab_size)
    _in_vocab("stop_token_ids", ext.stop_token_ids, vocab_size)
    # After the checks: a request refused by them needs no vLLM (and its unit test none either).
    from vllm.exceptions import VLLMClientError
    from vllm.sampling_params import RequestOutputKind, SamplingParams

    try:
        return SamplingParams(
            n=params.n,
            temperature=params.temperature,
            top_p=params.top_p,
            presence_penalty=params.presence_penalty,
            frequency_penalty=params.frequency_penalty,
            seed=params.seed,
            stop=list(params.stop) or None,
            max_tokens=max_tokens,
            logprobs=params.logprobs,
            logit_bias=params.logit_bias,
            structured_outputs=_structured_outputs(params),
            top_k=ext.top_k,
            min_p=ext.min_p,
            repetition_penalty=ext.repetition_penalty,
            min_tokens=ext.min_tokens,
            ignore_eos=ext.ignore_eos,
            stop_token_ids=list(ext.stop_token_ids) or None,
            include_stop_str_in_output=ext.include_stop_str_in_output,
            skip_special_tokens=ext.skip_special_tokens,
            spaces_between_special_tokens=ext.spaces_between_special_tokens,
            bad_words=list(ext.bad_words) or None,
            allowed_token_ids=None if allowed is None else list(allowed),
            # Only the final output of each request is wanted: no per-token RequestOutputs.
            output_kind=RequestOutputKind.FINAL_ONLY,
        )
    except (ValueError, TypeError, VLLMClientError) as exc:
        raise BadRequest(str(exc)) from exc


def _in_vocab(field: str, tokens: Iterable[int], vocab_size: int) -> None:
    """Refuse (a 400) a token id of body.`field` outside the model's vocabulary, as validation
    does (openai/token_ids.py): a job submitted before validation checked them."""
    message = outside_vocab(field, tokens, vocab_size)
    if message is not None:
        raise BadRequest(message)


def _structured_outputs(params: Sampling) -> Any:
    """vLLM's structured output constraint: a forced tool call's schema, or the
    `response_format`'s (None for text)."""
    output_format = params.output_format
    forced = params.forced_call
    if output_format is None and forced is None:
        return None
    from vllm.sampling_params import StructuredOutputsParams

    if forced is not None:
        # As vLLM's server: the call's JSON Schema (openai/toolchoice.py) is the constraint.
        return StructuredOutputsParams(json=dict(forced.schema))
    assert output_format is not None
    if output_format.schema is None:
        return StructuredOutputsParams(json_object=True)  # json_object, or a schema-less one
    return StructuredOutputsParams(json=dict(output_format.schema))


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
    # An encoder-decoder model's decoder context is its own too (Whisper's 448 tokens).
    if config.runner_type == "pooling" or getattr(config, "is_encoder_decoder", False):
        return min(wanted, int(config.max_model_len))
    return wanted
