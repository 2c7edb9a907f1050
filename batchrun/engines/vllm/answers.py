"""A finished vLLM completion as an OpenAI choice: reasoning split off (--reasoning-parser), then
tool calls read from the content (a forced call, or Hermes blocks with tools on auto), as vLLM's
server orders them; the finish reason OpenAI reports."""

from __future__ import annotations

from typing import Any

from batchrun.engines.vllm.reasoning import Reasoner
from batchrun.engines.vllm.tokens import TokenText
from batchrun.engines.vllm.tools import parse_tool_calls
from batchrun.openai.params import Sampling
from batchrun.openai.response_bodies import Choice, response_id
from batchrun.openai.toolchoice import forced_answer

# OpenAI knows "stop" and "length"; vLLM's "repetition" (an early stop on a detected loop, only
# when asked for) is a stop.
_OPENAI_FINISH_REASONS = {"stop": "stop", "length": "length"}


def choice_of(
    completion: Any,
    reason: str,
    params: Sampling,
    *,
    tokens: TokenText,
    reasoner: Reasoner | None,
    template_kwargs: dict[str, Any],
    prefix: str = "",
) -> Choice:
    """One vLLM CompletionOutput (finished with `reason`) as a Choice."""
    text = completion.text
    tool_calls = None
    reasoning, reasoning_tokens = None, 0
    if reasoner is not None:
        # First, as vLLM's server: tool calls are read from the content that follows.
        reasoning, text, reasoning_tokens = reasoner.split(
            text, list(completion.token_ids), template_kwargs
        )
    finish_reason = _OPENAI_FINISH_REASONS.get(reason, "stop")
    if params.forced_call is not None:
        text, tool_calls, finish_reason = forced_answer(
            params.forced_call, text, finish_reason, f"call_{response_id()[8:]}"
        )
    elif params.tools:
        text, tool_calls = parse_tool_calls(text)
        if tool_calls:
            finish_reason = "tool_calls"
    top = params.logprobs
    return Choice(
        text=prefix + text,
        finish_reason=finish_reason,
        token_count=len(completion.token_ids),
        logprobs=None if top is None else tokens.logprobs(completion, top),
        tool_calls=tool_calls,
        reasoning=reasoning,
        reasoning_tokens=reasoning_tokens,
    )
