"""The rules of a /v1/responses body (OpenAI's Responses API), and its input as chat messages.

A Responses request runs as a chat request does: `instructions` becomes a system message first,
then `input` (a string: one user message; or a list of input items: messages, earlier function
calls and their outputs), as vLLM's server builds them (entrypoints/openai/responses/utils.py,
construct_input_messages). Its typed parameters come from batchrun.openai.params like every
endpoint's; its answer is shaped by batchrun.openai.responses_api_body.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from batchrun.openai.chat import template_kwargs_check
from batchrun.openai.fields import (
    MAX_TOKENS_LIMIT,
    SAMPLING_CHECKS,
    FieldCheck,
    check_bool,
    check_metadata,
    check_stream,
    check_strict,
    check_string,
    format_object,
    input_items,
    int_in,
    number_in,
    refuse,
)
from batchrun.openai.invalid import bad, describe, json_kind, show
from batchrun.openai.media import check_input_image
from batchrun.openai.vllm_sampling import VLLM_SAMPLING_CHECKS

INPUT_ROLES = ("user", "system", "developer", "assistant")
# The content part types that carry text; input_image carries an image (a user message's only).
_TEXT_PARTS = ("input_text", "output_text")
IMAGE_PART = "input_image"
TEXT_FORMATS = ("text", "json_object", "json_schema")
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")


# What a request without body.input is told it needs.
_NEEDS = "a responses request needs a string or a list of input items"


def check_input(body: dict[str, Any]) -> None:
    """Raise unless body.input is a non-empty string or a list of supported input items."""
    value = input_items(body, _NEEDS, "a string or an array of input items")
    if value is None:
        return
    counts: dict[str, int] = {}  # image parts, over the whole request
    for i, item in enumerate(value):
        _check_item(f"body.input[{i}]", item, counts)


def _check_item(where: str, item: object, counts: dict[str, int]) -> None:
    if not isinstance(item, dict):
        bad(f"{where} must be an object (an input item), got {json_kind(item)}")
    kind = item.get("type", "message")
    if kind == "message":
        role = item.get("role")
        if role not in INPUT_ROLES:
            got = "it is missing" if "role" not in item else f"got {show(role)}"
            bad(f"{where}.role must be one of {', '.join(INPUT_ROLES)}; {got}")
        _check_content(where, role, item.get("content"), counts)
    elif kind == "function_call":
        for key in ("call_id", "name", "arguments"):
            if not isinstance(item.get(key), str):
                bad(f"{where}.{key} must be a string for an item of type 'function_call'")
    elif kind == "function_call_output":
        if not isinstance(item.get("call_id"), str):
            bad(f"{where}.call_id must be a string for an item of type 'function_call_output'")
        if not isinstance(item.get("output"), str):
            bad(
                f"{where}.output must be a string for an item of type 'function_call_output', "
                f"got {describe(item.get('output'))}"
            )
    else:
        bad(
            f"{where}.type {show(kind)} is not supported: batchrun takes the input items "
            "'message', 'function_call' and 'function_call_output'"
        )


def _check_content(where: str, role: object, content: object, counts: dict[str, int]) -> None:
    if isinstance(content, str):
        return
    if not isinstance(content, list) or not content:
        bad(
            f"{where}.content must be a string or a non-empty array of content parts, "
            f"got {describe(content)}"
        )
    for j, part in enumerate(content):
        pwhere = f"{where}.content[{j}]"
        if not isinstance(part, dict):
            bad(f"{pwhere} must be an object with a type, got {describe(part)}")
        kind = part.get("type")
        if kind == IMAGE_PART:
            if role != "user":
                bad(f"{pwhere}.type 'input_image' is only taken in a user message")
            # The cheap checks of a chat image_url part (openai/media.py); read in the worker.
            check_input_image(pwhere, part, counts)
            continue
        if kind not in _TEXT_PARTS:
            bad(
                f"{pwhere}.type {show(kind)} is not supported: a part is of type "
                "'input_text', 'output_text' or 'input_image'"
            )
        if not isinstance(part.get("text"), str):
            bad(f"{pwhere}.text must be a string for a part of type {show(kind)}")


def _check_text(key: str, value: object) -> None:
    if not isinstance(value, dict):
        bad(
            f'body.{key} must be an object such as {{"format": {{"type": "text"}}}}, got {describe(value)}'
        )
    for field in value:
        if field == "verbosity":
            bad(
                f"body.{key}.verbosity is not supported: only OpenAI's own models take it; remove it"
            )
        if field != "format":
            bad(f"body.{key}.{field} is not a field of body.{key} (it takes format)")
    fmt = value.get("format")
    if fmt is None:
        return
    fmt = format_object(f"body.{key}.format", fmt, TEXT_FORMATS)
    if fmt["type"] != "json_schema":
        return
    # The Responses API puts name and schema beside the type (chat nests them in json_schema).
    name = fmt.get("name")
    if not isinstance(name, str) or not name:
        got = "it is missing" if "name" not in fmt else f"got {describe(name)}"
        bad(f"body.{key}.format.name must be a non-empty string for type 'json_schema'; {got}")
    schema = fmt.get("schema")
    if not isinstance(schema, dict):
        got = "it is missing" if "schema" not in fmt else f"got {describe(schema)}"
        bad(f"body.{key}.format.schema must be a JSON Schema object for type 'json_schema'; {got}")
    check_strict(f"body.{key}.format", fmt)


def _check_reasoning(key: str, value: object) -> None:
    if not isinstance(value, dict):
        bad(f'body.{key} must be an object such as {{"effort": "low"}}, got {describe(value)}')
    for field, item in value.items():
        if item is None:
            continue
        if field == "effort":
            if item not in REASONING_EFFORTS:
                bad(
                    f"body.{key}.effort must be one of {', '.join(REASONING_EFFORTS)}, "
                    f"got {show(item)}"
                )
        elif field in ("summary", "generate_summary"):
            bad(
                f"body.{key}.{field} is not supported: a local model's reasoning is returned "
                "whole (a reasoning item with --reasoning-parser), never summarised; remove it"
            )
        else:
            bad(f"body.{key}.{field} is not a field of body.{key} (it takes effort)")


def _check_truncation(key: str, value: object) -> None:
    if value == "disabled":
        return
    if value == "auto":
        bad(
            f"body.{key} 'auto' is not supported: batchrun never cuts a prompt; a prompt longer "
            "than the context is a context_length_exceeded error; use 'disabled' or remove it"
        )
    bad(f"body.{key} must be 'disabled' or 'auto', got {describe(value)}")


_NO_STORED = "a batch line stands alone: no response or conversation is stored to continue"

_NO_TOOLS = (
    "tools are not run on /v1/responses; use /v1/chat/completions, where function tools and "
    "tool_choice are honoured"
)

# The chat sampling fields vLLM's Responses endpoint takes beyond OpenAI's Responses API.
_CHAT_SAMPLING = ("seed", "stop", "presence_penalty", "frequency_penalty", "logit_bias")

RESPONSES_CHECKS: dict[str, FieldCheck] = {
    "instructions": check_string,
    "max_output_tokens": int_in(1, MAX_TOKENS_LIMIT),
    "temperature": number_in(0, 2),
    "top_p": number_in(0, 1, low_open=True),
    "text": _check_text,
    "reasoning": _check_reasoning,
    "metadata": check_metadata,
    "parallel_tool_calls": check_bool,
    "store": check_bool,
    "stream": check_stream,
    "truncation": _check_truncation,
    "user": check_string,
    "service_tier": check_string,
    "prompt_cache_key": check_string,
    "safety_identifier": check_string,
    "tools": refuse(_NO_TOOLS),
    "tool_choice": refuse("it only applies to tools, which /v1/responses does not run here"),
    "max_tool_calls": refuse("it only applies to tools, which /v1/responses does not run here"),
    "previous_response_id": refuse(_NO_STORED),
    "conversation": refuse(_NO_STORED),
    "prompt": refuse("stored prompt templates live on OpenAI's service"),
    "background": refuse("a batch already runs in the background"),
    "include": refuse(
        "no extra output (logprobs, encrypted reasoning, search results) is produced"
    ),
    "top_logprobs": refuse("logprobs are not produced on /v1/responses; use /v1/chat/completions"),
    "stream_options": refuse("it only applies to stream, which a batch does not support"),
    # vLLM's extensions of the Responses API (its protocol's "responses-extra-params"): chat's
    # sampling fields and its template variables, honoured as on chat.
    **{k: SAMPLING_CHECKS[k] for k in _CHAT_SAMPLING},
    **VLLM_SAMPLING_CHECKS,
    # Not "give tools as body.tools", chat's advice: body.tools is refused here too.
    "chat_template_kwargs": template_kwargs_check(f"remove it: {_NO_TOOLS}"),
}


def responses_messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A validated body's instructions and input as chat messages (vLLM's construction)."""
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions:
        messages.append({"role": "system", "content": instructions})
    value = body["input"]
    if isinstance(value, str):
        messages.append({"role": "user", "content": value})
        return messages
    for item in value:
        kind = item.get("type", "message")
        if kind == "message":
            content = item["content"]
            if isinstance(content, list):
                content = _chat_content(content)
            messages.append({"role": item["role"], "content": content})
        elif kind == "function_call":
            call = {
                "id": item["call_id"],
                "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]},
            }
            previous = messages[-1] if messages else None
            # Calls right after an assistant message belong to it, as vLLM merges them.
            if previous is not None and previous["role"] == "assistant":
                previous.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        else:  # function_call_output
            messages.append(
                {"role": "tool", "content": item["output"], "tool_call_id": item["call_id"]}
            )
    return messages


def _chat_content(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """A message's content parts as chat content: its texts joined by lines (as vLLM joins
    them); with an input_image, chat parts in order, each image an image_url part, so that the
    worker renders it as it renders a chat line's image."""
    if not any(part.get("type") == IMAGE_PART for part in parts):
        return "\n".join(part["text"] for part in parts)
    chat: list[dict[str, Any]] = []
    for part in parts:
        if part.get("type") == IMAGE_PART:
            image: dict[str, Any] = {"url": part["image_url"]}
            if part.get("detail") is not None:
                image["detail"] = part["detail"]
            chat.append({"type": "image_url", "image_url": image})
        else:
            chat.append({"type": "text", "text": part["text"]})
    return chat


def last_user_text(body: Mapping[str, Any]) -> str:
    """The text of the input's last user message (what the echo engine answers with)."""
    for message in reversed(responses_messages(body)):
        if message["role"] == "user":
            content = message["content"]
            if isinstance(content, list):  # with images: the text parts only
                return "\n".join(p["text"] for p in content if p["type"] == "text")
            return str(content)
    return ""


def reasoning_effort(body: Mapping[str, Any]) -> str | None:
    """body.reasoning.effort, for chat templates that read `reasoning_effort`."""
    reasoning = body.get("reasoning")
    if isinstance(reasoning, Mapping):
        effort = reasoning.get("effort")
        return effort if isinstance(effort, str) else None
    return None
