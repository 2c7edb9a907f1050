"""The rules of a /v1/completions body: the prompt, logprobs, echo, best_of."""

from __future__ import annotations

from typing import Any

from batchrun.openai.fields import MAX_N, SAMPLING_CHECKS, FieldCheck, check_bool, int_in, refuse
from batchrun.openai.invalid import bad, describe
from batchrun.openai.params import COMPLETIONS_DEFAULT_MAX_TOKENS
from batchrun.openai.vllm_sampling import VLLM_SAMPLING_CHECKS, check_min_tokens

MAX_COMPLETION_LOGPROBS = 5  # the legacy completions' logprobs, as OpenAI limits it


def check_prompt(body: dict[str, Any]) -> None:
    if "prompt" not in body:
        bad("body.prompt is missing; a completions request needs a prompt string")
    prompt = body["prompt"]
    if isinstance(prompt, list):
        if len(prompt) != 1:
            bad(
                f"body.prompt must be a string or an array of exactly one string, got an array "
                f"of {len(prompt)} items (batchrun runs one prompt per request)"
            )
        prompt = prompt[0]
        where = "body.prompt[0]"
    else:
        where = "body.prompt"
    if not isinstance(prompt, str):
        bad(f"{where} must be a string, got {describe(prompt)}")
    if not prompt:
        bad(f"{where} must not be empty")


def check_completion_combinations(body: dict[str, Any]) -> None:
    best_of, n = body.get("best_of"), body.get("n")
    n = 1 if n is None else n
    if best_of is not None and best_of != n:
        # vLLM 0.32 has no best_of: it can only return the n sequences it samples.
        bad(
            f"body.best_of {best_of} is not supported: only best_of equal to n ({n}) can be "
            "honoured (vLLM returns every sequence it samples); remove it"
        )
    if body.get("echo") is True and body.get("logprobs") is not None:
        bad(
            "body.echo together with body.logprobs is not supported: the prompt's first token "
            "has no logprob, which the Completion type cannot hold; drop one of them"
        )
    limit = body.get("max_tokens")
    check_min_tokens(body, COMPLETIONS_DEFAULT_MAX_TOKENS if limit is None else limit)


COMPLETION_CHECKS: dict[str, FieldCheck] = {
    **SAMPLING_CHECKS,
    **VLLM_SAMPLING_CHECKS,
    "logprobs": int_in(0, MAX_COMPLETION_LOGPROBS),
    "echo": check_bool,
    "best_of": int_in(1, MAX_N),
    "suffix": refuse("vLLM cannot insert text between a prompt and a suffix"),
}
