"""A finished generation request out of vLLM: its RequestOutput as a success, or as a retryable
failure when vLLM finished it with an error or an abort."""

from __future__ import annotations

from typing import Any

from batchrun.engines.vllm.answers import choice_of
from batchrun.engines.vllm.prompts import completion_prompt
from batchrun.engines.vllm.reasoning import Reasoner
from batchrun.engines.vllm.tokens import TokenText
from batchrun.openai.params import Sampling, sampling
from batchrun.openai.records import CHAT, RESPONSES, Outcome, Request
from batchrun.openai.response_bodies import failure, response_model, success


def generation_outcome(
    request: Request,
    params: Sampling | None,
    template_kwargs: dict[str, Any],
    output: Any,
    latency_s: float,
    *,
    tokens: TokenText,
    reasoner: Reasoner | None,
    model_name: str,
) -> Outcome:
    """Turn a finished RequestOutput into a success, or a retryable failure if vLLM failed.
    `params` and `template_kwargs` are what the request was added with; `reasoner` the engine's
    (used for chat and responses requests only)."""
    completions = sorted(output.outputs, key=lambda c: int(c.index))
    reasons = [str(c.finish_reason) if c.finish_reason is not None else "stop" for c in completions]
    # "error" is vLLM's retryable internal failure (e.g. a lost KV block); "abort" means the
    # request was cancelled inside vLLM. Neither is an answer; another attempt may be.
    for reason in ("error", "abort"):
        if reason in reasons:
            return failure(
                request,
                "engine_error" if reason == "error" else "aborted",
                f"vLLM finished the request with finish_reason={reason!r}",
                status_code=500,
                retryable=True,
                latency_s=latency_s,
            )
    params = params or sampling(request)
    prefix = completion_prompt(request.body.get("prompt")) if params.echo else ""
    reasoner = reasoner if request.url in (CHAT, RESPONSES) else None
    choices = [
        choice_of(
            c,
            reason,
            params,
            tokens=tokens,
            reasoner=reasoner,
            template_kwargs=template_kwargs,
            prefix=prefix,
        )
        for c, reason in zip(completions, reasons, strict=True)
    ]
    prompt_ids = output.prompt_token_ids
    # The prompt tokens vLLM found in its prefix cache (whole blocks: 16 tokens each on a
    # GPU by default, 128 on the CPU backend).
    cached = getattr(output, "num_cached_tokens", None)
    return success(
        request,
        choices,
        model=response_model(request, model_name),
        prompt_tokens=len(prompt_ids) if prompt_ids is not None else 0,
        latency_s=latency_s,
        reasoning=reasoner is not None,
        cached_tokens=int(cached) if cached is not None else None,
    )
