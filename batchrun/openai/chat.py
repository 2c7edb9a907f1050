"""The rules of a /v1/chat/completions body: messages, roles, content parts, tools, ..."""

from __future__ import annotations

from typing import Any

from batchrun.openai.fields import (
    MAX_TOKENS_LIMIT,
    SAMPLING_CHECKS,
    FieldCheck,
    check_bool,
    check_metadata,
    check_string,
    int_in,
    refuse,
    refuse_unless,
)
from batchrun.openai.invalid import bad, describe, json_kind, show
from batchrun.openai.media import check_media_part, is_media_part
from batchrun.openai.toolchoice import check_forced_combination, check_tool_choice
from batchrun.openai.vllm_sampling import VLLM_SAMPLING_CHECKS, check_min_tokens

MAX_TOP_LOGPROBS = 20  # chat's top_logprobs, as OpenAI limits it
CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")
_ROLE_SET = frozenset(CHAT_ROLES)


def check_messages(body: dict[str, Any]) -> None:
    if "messages" not in body:
        bad("body.messages is missing; a chat request needs a list of messages")
    messages = body["messages"]
    if not isinstance(messages, list):
        bad(f"body.messages must be an array of messages, got {json_kind(messages)}")
    if not messages:
        bad("body.messages must not be empty")
    # This loop is hot (every message of every line): the common case, a known role and a
    # plain string content, passes without building a field path or calling a helper.
    counts: dict[str, int] = {}  # media parts by modality, over the whole request
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            bad(f"body.messages[{i}] must be an object with role and content, got {json_kind(msg)}")
        role = msg.get("role")
        # The type test first: an unhashable role (an array) would make `in` raise.
        if type(role) is not str or role not in _ROLE_SET:
            got = "it is missing" if "role" not in msg else f"got {show(role)}"
            bad(f"body.messages[{i}].role must be one of {', '.join(CHAT_ROLES)}; {got}")
        if type(msg.get("content")) is not str:
            _check_content(f"body.messages[{i}]", role, msg, counts)


def _check_content(where: str, role: object, msg: dict[str, Any], counts: dict[str, int]) -> None:
    content = msg.get("content")
    if isinstance(content, str):
        return
    if content is None:
        # An assistant turn that only calls tools has no content, as in the OpenAI API.
        if role == "assistant" and (msg.get("tool_calls") or msg.get("function_call")):
            return
        got = "it is missing" if "content" not in msg else "got null"
        bad(f"{where}.content must be a string or an array of content parts; {got}")
    if not isinstance(content, list):
        bad(
            f"{where}.content must be a string or an array of content parts, "
            f"got {describe(content)}"
        )
    if not content:
        bad(f"{where}.content must not be an empty array")
    for j, part in enumerate(content):
        pwhere = f"{where}.content[{j}]"
        if not isinstance(part, dict):
            bad(f"{pwhere} must be an object with a type, got {describe(part)}")
        ptype = part.get("type")
        if not isinstance(ptype, str):
            got = "it is missing" if "type" not in part else f"got {show(ptype)}"
            bad(f"{pwhere}.type must be a string such as 'text'; {got}")
        if ptype != "text":
            if is_media_part(ptype) and role == "user":
                # Cheap checks only (openai/media.py): the worker reads and decodes the media.
                check_media_part(pwhere, part, counts)
                continue
            kinds = "'text', 'image_url', 'input_audio', 'audio_url' or 'video_url'"
            if is_media_part(ptype):
                bad(f"{pwhere}.type {show(ptype)} is only taken in a user message")
            bad(f"{pwhere}.type {show(ptype)} is not supported: a part is of type {kinds}")
        if not isinstance(part.get("text"), str):
            bad(f"{pwhere}.text must be a string for a part of type 'text'")


def _check_modalities(key: str, value: object) -> None:
    if not isinstance(value, list) or not all(isinstance(m, str) for m in value):
        bad(f'body.{key} must be an array of strings such as ["text"], got {describe(value)}')
    for m in value:
        if m == "audio":
            bad(
                f"body.{key} asks for audio output, which batchrun cannot produce (it runs text "
                'models); use ["text"] or remove the field'
            )
        if m != "text":
            bad(
                f'body.{key} may only hold "text" (and "audio" for OpenAI\'s audio models), got {show(m)}'
            )


def _check_tools(key: str, value: object) -> None:
    if not isinstance(value, list):
        bad(f"body.{key} must be an array of tools, got {describe(value)}")
    for i, tool in enumerate(value):
        if not isinstance(tool, dict):
            bad(f"body.{key}[{i}] must be an object, got {describe(tool)}")
        if tool.get("type") != "function":
            bad(
                f"body.{key}[{i}].type must be 'function' (the only kind of tool a local model "
                f"can be given), got {show(tool.get('type'))}"
            )
        fn = tool.get("function")
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            bad(f"body.{key}[{i}].function must be an object with a non-empty string name")
        params = fn.get("parameters")
        if params is not None and not isinstance(params, dict):
            bad(
                f"body.{key}[{i}].function.parameters must be a JSON Schema object, "
                f"got {describe(params)}"
            )


# apply_chat_template's own parameters, and the variables batchrun renders from the request's
# own fields: none of them is a template variable a request may set in chat_template_kwargs.
RENDERER_NAMES = frozenset(
    {
        "messages", "conversation", "tools", "documents", "chat_template",
        "add_generation_prompt", "continue_final_message", "tokenize", "padding", "truncation",
        "max_length", "return_tensors", "return_dict", "return_assistant_tokens_mask",
        "tokenizer_kwargs",
    }
)  # fmt: skip


def template_kwargs_check(tools_instead: str) -> FieldCheck:
    """vLLM's chat_template_kwargs: extra variables for the chat template (enable_thinking).
    `tools_instead`: what the endpoint's refusal of `tools` among them advises (each endpoint
    takes tools its own way, or not at all)."""

    def check(key: str, value: object) -> None:
        if not isinstance(value, dict):
            bad(
                f"body.{key} must be an object of chat template variables such as "
                f'{{"enable_thinking": false}}, got {describe(value)}'
            )
        for name in value:
            if name in RENDERER_NAMES:
                instead = tools_instead if name == "tools" else "remove it"
                bad(
                    f"body.{key}.{name} is not a template variable a request may set: batchrun "
                    f"renders the prompt with it itself; {instead}"
                )

    return check


check_template_kwargs = template_kwargs_check("give tools as body.tools")


def check_chat_combinations(body: dict[str, Any]) -> None:
    if body.get("top_logprobs") is not None and body.get("logprobs") is not True:
        bad("body.top_logprobs needs body.logprobs set to true")
    check_forced_combination(body)
    limit = body.get("max_completion_tokens")
    check_min_tokens(body, body.get("max_tokens") if limit is None else limit)


_NO_AUDIO = "batchrun runs text models, which produce no audio"

CHAT_CHECKS: dict[str, FieldCheck] = {
    **SAMPLING_CHECKS,
    **VLLM_SAMPLING_CHECKS,
    "max_completion_tokens": int_in(1, MAX_TOKENS_LIMIT),
    "logprobs": check_bool,
    "top_logprobs": int_in(0, MAX_TOP_LOGPROBS),
    "metadata": check_metadata,
    "tools": _check_tools,
    "tool_choice": check_tool_choice,
    "parallel_tool_calls": check_bool,
    "modalities": _check_modalities,
    "store": check_bool,
    "service_tier": check_string,
    "prompt_cache_key": check_string,
    "safety_identifier": check_string,
    "audio": refuse(_NO_AUDIO),
    "functions": refuse("the deprecated functions API is not run; pass body.tools instead"),
    "function_call": refuse(
        "the deprecated functions API is not run; pass body.tool_choice instead"
    ),
    "prediction": refuse("predicted outputs are an OpenAI service feature vLLM does not have"),
    "web_search_options": refuse("a local model has no web search"),
    "verbosity": refuse("only OpenAI's own models take it"),
    "moderation": refuse("batchrun runs no moderation model"),
    # vLLM's chat extensions: the template's variables honoured (as vLLM's server passes them);
    # the rest would render a prompt other than the model's own template's answer turn.
    "chat_template_kwargs": check_template_kwargs,
    "chat_template": refuse_unless(None, "a job renders with its model's chat template"),
    "add_generation_prompt": refuse_unless(True, "every answer starts a new assistant turn"),
    "continue_final_message": refuse_unless(False, "every answer starts a new assistant turn"),
    "documents": refuse_unless(None, "batchrun passes no documents to the chat template"),
}
