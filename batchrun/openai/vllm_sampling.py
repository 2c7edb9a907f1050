"""vLLM's sampling extensions: request fields OpenAI does not define that vLLM's own server honours
on /v1/chat/completions, /v1/completions and /v1/responses (its protocols' "sampling params"),
honoured the same way here; and the fields of that block batchrun cannot run, refused naming the field.

A user moving a job from `vllm serve` or `vllm run-batch` sets `top_k`, `repetition_penalty` or
`ignore_eos` and expects them to act: dropped without a word, the answers would silently differ.
Every other field OpenAI does not define is still ignored, as vLLM's server ignores it.
"""

from __future__ import annotations

import math
from typing import Any

import msgspec

from batchrun.openai.fields import (
    MAX_TOKENS_LIMIT,
    FieldCheck,
    check_bool,
    int_in,
    number_in,
    refuse_unless,
)
from batchrun.openai.invalid import bad, describe, show


class VllmSampling(msgspec.Struct, frozen=True):
    """The extensions a request set, with vLLM's defaults for the others (SamplingParams')."""

    top_k: int = 0  # 0 (or -1): no limit
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    bad_words: tuple[str, ...] = ()
    allowed_token_ids: tuple[int, ...] | None = None


def _check_top_k(key: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        bad(f"body.{key} must be a whole number, got {describe(value)}")
    if value < -1:
        bad(f"body.{key} must be 0 or -1 (no limit) or at least 1, got {show(value)}")


def _check_positive(key: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        bad(f"body.{key} must be a number, got {describe(value)}")
    if not (value > 0 and math.isfinite(value)):
        bad(f"body.{key} must be greater than 0 (1 is no penalty), got {show(value)}")


def _token_ids(*, empty: bool) -> FieldCheck:
    def check(key: str, value: object) -> None:
        if not isinstance(value, list):
            bad(f"body.{key} must be an array of token ids, got {describe(value)}")
        if not value and not empty:
            bad(f"body.{key} must not be empty: it names the only tokens the answer may hold")
        for i, token in enumerate(value):
            if isinstance(token, bool) or not isinstance(token, int) or token < 0:
                bad(f"body.{key}[{i}] must be a token id (a whole number >= 0), got {show(token)}")

    return check


def _check_bad_words(key: str, value: object) -> None:
    if not isinstance(value, list):
        bad(f"body.{key} must be an array of strings, got {describe(value)}")
    for i, word in enumerate(value):
        if not isinstance(word, str) or not word:
            bad(f"body.{key}[{i}] must be a non-empty string, got {show(word)}")


VLLM_SAMPLING_CHECKS: dict[str, FieldCheck] = {
    "top_k": _check_top_k,
    "min_p": number_in(0, 1),
    "repetition_penalty": _check_positive,
    "min_tokens": int_in(0, MAX_TOKENS_LIMIT),
    "ignore_eos": check_bool,
    "stop_token_ids": _token_ids(empty=True),
    "include_stop_str_in_output": check_bool,
    "skip_special_tokens": check_bool,
    "spaces_between_special_tokens": check_bool,
    "bad_words": _check_bad_words,
    "allowed_token_ids": _token_ids(empty=False),
    # The rest of vLLM's block: each would change the answer's content or shape.
    "use_beam_search": refuse_unless(False, "batchrun samples; it runs no beam search"),
    "prompt_logprobs": refuse_unless(None, "answers carry no prompt logprobs"),
    "logprob_token_ids": refuse_unless(None, "answers carry the top_logprobs tokens only"),
    "truncate_prompt_tokens": refuse_unless(
        None, "a prompt is never cut; one too long for the context is a 400"
    ),
    "watermarking": refuse_unless(False, "batchrun does not watermark answers"),
    "structured_outputs": refuse_unless(None, "give the constraint as body.response_format"),
}

# The extensions honoured (the rest of the table refuses): a body with none of them, as most
# are, is not read for them at all.
HONOURED = frozenset(VllmSampling.__struct_fields__)


def check_min_tokens(body: dict[str, Any], max_tokens: object) -> None:
    """Refuse `min_tokens` above the request's token limit (`max_tokens`, as the endpoint
    defaults it; None: the rest of the context, which the engine checks)."""
    least = body.get("min_tokens")
    if isinstance(least, int) and isinstance(max_tokens, int) and least > max_tokens:
        bad(
            f"body.min_tokens {least} is more than the answer's limit of {max_tokens} tokens "
            "(max_tokens); lower it or raise max_tokens"
        )


def vllm_sampling(body: dict[str, Any]) -> VllmSampling | None:
    """The typed extensions of a validated body; None when it sets none of them."""
    if HONOURED.isdisjoint(body):
        return None
    get = body.get
    top_k, min_p, penalty = get("top_k"), get("min_p"), get("repetition_penalty")
    least, stops, words = get("min_tokens"), get("stop_token_ids"), get("bad_words")
    only = get("allowed_token_ids")
    return VllmSampling(
        top_k=0 if top_k is None else top_k,
        min_p=0.0 if min_p is None else float(min_p),
        repetition_penalty=1.0 if penalty is None else float(penalty),
        min_tokens=0 if least is None else least,
        ignore_eos=get("ignore_eos") is True,
        stop_token_ids=tuple(stops or ()),
        include_stop_str_in_output=get("include_stop_str_in_output") is True,
        skip_special_tokens=get("skip_special_tokens") is not False,
        spaces_between_special_tokens=get("spaces_between_special_tokens") is not False,
        bad_words=tuple(words or ()),
        allowed_token_ids=None if only is None else tuple(only),
    )
