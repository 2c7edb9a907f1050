"""A request's prompt as token ids: chat messages through the model's chat template (with its
extra inputs: the request's chat_template_kwargs, tools and reasoning_effort, when the template
takes them), or the completions prompt.

Prompts are tokenized here, not inside vLLM, so that a request that cannot fit in the context
becomes a per-request 400 outcome before it reaches the engine.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from batchrun.engines.vllm.errors import BadRequest
from batchrun.engines.vllm.tools import template_tool_call
from batchrun.openai.records import CHAT, COMPLETIONS, RESPONSES, Request
from batchrun.openai.responses_api import reasoning_effort, responses_messages
from batchrun.openai.toolchoice import is_forced


def prompt_token_ids(
    tokenizer: Any,
    request: Request,
    *,
    template: str,
    model_name: str,
    kwargs: dict[str, Any] | None = None,
) -> list[int]:
    """Tokenize the request's prompt (chat messages through the model's chat template).

    `kwargs`: the template's extra inputs, when the caller has them (see `request_template_kwargs`).
    """
    body = request.body
    if request.url in (CHAT, RESPONSES):
        if kwargs is None:
            kwargs = request_template_kwargs(request, template=template, model_name=model_name)
        if request.url == CHAT:
            messages = chat_messages(body.get("messages"))
        else:
            # A Responses request is rendered as the chat it amounts to (as vLLM's server does).
            messages = chat_messages(responses_messages(body))
        try:
            text = tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True, **kwargs
            )
        except Exception as exc:  # a template may raise on roles or orders it rejects
            raise BadRequest(f"the model's chat template rejected the messages: {exc}") from exc
        # The template already wrote the special tokens the model expects.
        ids = tokenizer.encode(str(text), add_special_tokens=False)
    elif request.url == COMPLETIONS:
        ids = tokenizer.encode(completion_prompt(body.get("prompt")))
    else:
        raise BadRequest(f"unsupported endpoint {request.url!r}")
    if not ids:
        raise BadRequest("the prompt is empty")
    return [int(i) for i in ids]


def request_template_kwargs(request: Request, *, template: str, model_name: str) -> dict[str, Any]:
    """A chat or responses request's extra template inputs (a reasoning parser reads them too)."""
    if request.url == RESPONSES:
        fields = {
            "reasoning_effort": reasoning_effort(request.body),
            "chat_template_kwargs": request.body.get("chat_template_kwargs"),
        }
        return template_kwargs(
            fields, template=template, model_name=model_name, effort_field="reasoning.effort"
        )
    return template_kwargs(request.body, template=template, model_name=model_name)


def template_kwargs(
    body: Mapping[str, Any],
    *,
    template: str,
    model_name: str,
    effort_field: str = "reasoning_effort",
) -> dict[str, Any]:
    """The chat template's extra inputs: the request's own `chat_template_kwargs` (vLLM's
    extension), then tools and reasoning_effort, if the template takes them.

    `effort_field`: where the request set the effort, for the message (a responses request's
    is reasoning.effort).
    """
    # As vLLM's server: the request's variables first, the fields batchrun renders over them
    # (validation refused the names that would clash: openai/chat.RENDERER_NAMES).
    given = body.get("chat_template_kwargs")
    kwargs: dict[str, Any] = dict(given) if isinstance(given, dict) else {}
    tools = body.get("tools")
    if tools:
        # A forced call needs no place in the template: the constraint holds the tools' names
        # and parameter schemas, and the answer is a call of them whatever the model saw.
        if not template_takes(template, "tools") and not is_forced(body.get("tool_choice")):
            raise BadRequest(
                f"body.tools is not supported with {model_name}: its chat template has "
                "no place for tools, so the model would never see them; remove body.tools "
                "or use a model whose chat template takes tools"
            )
        kwargs["tools"] = tools
    effort = body.get("reasoning_effort")
    if effort is not None:
        # As vLLM's server: the effort itself, and for templates that switch thinking on and
        # off (Qwen3's), enable_thinking unless the effort is "none".
        takes_effort = template_takes(template, "reasoning_effort")
        takes_switch = template_takes(template, "enable_thinking")
        if not takes_effort and not takes_switch:
            raise BadRequest(
                f"body.{effort_field} is not supported with {model_name}: its chat "
                "template takes no reasoning effort (it is not a reasoning model); remove it"
            )
        if takes_effort:
            kwargs["reasoning_effort"] = effort
        if takes_switch and "enable_thinking" not in kwargs:  # the request's own wins
            kwargs["enable_thinking"] = effort != "none"
    return kwargs


def template_takes(template: str, name: str) -> bool:
    """Whether a chat template reads the variable `name` (e.g. tools), so it can be honoured."""
    return re.search(rf"\b{re.escape(name)}\b", template) is not None


def chat_messages(messages: object) -> list[dict[str, Any]]:
    """The messages for the chat template: text content (parts joined), tool fields kept."""
    if not isinstance(messages, list) or not messages:
        raise BadRequest("`messages` must be a non-empty list")
    result: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise BadRequest(f"messages[{i}] must be an object with a string `role`")
        content = message.get("content")
        if content is None:
            text = ""  # e.g. an assistant turn that only called tools
        elif isinstance(content, str):
            text = content
        elif isinstance(content, list):
            text = _join_text_parts(content, i)
        else:
            raise BadRequest(f"messages[{i}].content must be a string or a list of parts")
        entry: dict[str, Any] = {"role": str(message["role"]), "content": text}
        for key in ("name", "tool_call_id"):
            if isinstance(message.get(key), str):
                entry[key] = message[key]
        if isinstance(message.get("tool_calls"), list):
            entry["tool_calls"] = [template_tool_call(c) for c in message["tool_calls"]]
        result.append(entry)
    return result


def _join_text_parts(parts: list[Any], index: int) -> str:
    """Join a message's text parts (with newlines, as vLLM's server does); refuse other parts."""
    texts: list[str] = []
    for j, part in enumerate(parts):
        if not isinstance(part, Mapping):
            raise BadRequest(f"messages[{index}].content[{j}] must be an object")
        kind = part.get("type")
        if kind != "text":
            raise BadRequest(
                f"messages[{index}].content[{j}]: content parts of type {kind!r} are not "
                "supported (text only)"
            )
        text = part.get("text")
        if not isinstance(text, str):
            raise BadRequest(f"messages[{index}].content[{j}].text must be a string")
        texts.append(text)
    return "\n".join(texts)


def completion_prompt(prompt: object) -> str:
    """The completions prompt: a string, or a list holding exactly one string."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        return prompt[0]
    if isinstance(prompt, list):
        raise BadRequest(
            "`prompt` must be a string or a list of one string (one prompt per batch line)"
        )
    raise BadRequest("`prompt` must be a string")
