"""A forced tool call (`tool_choice: "required"` or a named function), as vLLM's server does it.

The answer is constrained by a JSON Schema built from the tools, exactly as vLLM builds it
(vllm/tool_parsers/utils.py, get_json_schema_from_tools): for a named function, that function's
parameters (the answer is its arguments object); for "required", an array of at least one
`{"name", "parameters"}` object, one of the listed tools each (at most one with
`parallel_tool_calls: false`). The text generated under it is then read back into OpenAI tool
calls the way vLLM's parser reads it (vllm/parser/abstract_parser.py, `_extract_tool_calls`).
Every engine uses this module, so the calls and their finish reasons are the same on each.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from batchrun.openai.invalid import bad, describe, show

# Empty or missing parameters still constrain the arguments to a JSON object (as vLLM does).
_ANY_OBJECT: dict[str, Any] = {"type": "object", "properties": {}}


class ForcedCall(msgspec.Struct, frozen=True):
    """A tool call the answer must be: of the function `name`, or (None) of any listed tool."""

    schema: dict[str, Any]
    name: str | None = None


def forced_name(tool_choice: object) -> str | None:
    """The function a named `tool_choice` forces; None for the string choices."""
    if isinstance(tool_choice, Mapping):
        function = tool_choice.get("function")
        if isinstance(function, Mapping) and isinstance(function.get("name"), str):
            return str(function["name"])
    return None


def is_forced(tool_choice: object) -> bool:
    """Whether `tool_choice` forces a call ("required" or a named function)."""
    return tool_choice == "required" or isinstance(tool_choice, Mapping)


def forced_call(body: Mapping[str, Any]) -> ForcedCall | None:
    """The call a validated chat body forces, with its schema; None when none is forced."""
    choice = body.get("tool_choice")
    tools = body.get("tools")
    if not is_forced(choice) or not isinstance(tools, list) or not tools:
        return None
    functions = [t["function"] for t in tools]
    name = forced_name(choice)
    if name is not None:
        params = next(f.get("parameters") for f in functions if f["name"] == name)
        return ForcedCall(schema=dict(params) if params else _ANY_OBJECT, name=name)
    return ForcedCall(schema=_required_schema(functions, body.get("parallel_tool_calls")))


def _required_schema(functions: Sequence[Mapping[str, Any]], parallel: object) -> dict[str, Any]:
    """vLLM's schema for "required": an array of calls of the listed tools, `$defs` merged."""
    calls = []
    defs: dict[str, Any] = {}
    for function in functions:
        params = function.get("parameters")
        if params:
            params = dict(params)
            # Validation made the $defs of every tool agree; they move to the array's top.
            defs.update(params.pop("$defs", None) or {})
        calls.append(
            {
                "properties": {
                    "name": {"type": "string", "enum": [function["name"]]},
                    "parameters": params if params else _ANY_OBJECT,
                },
                "required": ["name", "parameters"],
            }
        )
    schema: dict[str, Any] = {
        "type": "array",
        "minItems": 1,
        "items": {"type": "object", "anyOf": calls},
    }
    # Only an explicit false opts out of parallel calls; unset means OpenAI's default (true).
    if parallel is False:
        schema["maxItems"] = 1
    if defs:
        schema["$defs"] = defs
    return schema


def read_forced_calls(forced: ForcedCall, text: str, call_id: str) -> list[dict[str, Any]] | None:
    """The OpenAI tool calls in `text` generated under `forced`'s schema; None when the text
    holds no call (it was cut short by max_tokens: then it stays the answer's content).

    `call_id` is the id of the first call; further ones get `_1`, `_2`, ... appended.
    """
    if forced.name is not None:
        if not text.strip():
            return None
        # As vLLM's: the whole answer is the named function's arguments, passed on as written.
        return [_call(call_id, forced.name, text)]
    try:
        parsed = json.loads(text)
    except ValueError:
        return None
    if not isinstance(parsed, list) or not parsed:
        return None
    calls = []
    for i, item in enumerate(parsed):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            return None
        arguments = json.dumps(item.get("parameters", {}), ensure_ascii=False)
        calls.append(_call(call_id if i == 0 else f"{call_id}_{i}", item["name"], arguments))
    return calls


def _call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def check_tool_choice(key: str, value: object) -> None:
    """body.tool_choice: "none", "auto", "required", or {"type": "function", "function": {name}}."""
    if value in ("none", "auto", "required"):
        return
    if not isinstance(value, Mapping):
        bad(
            f"body.{key} must be 'none', 'auto', 'required' or an object naming a function, "
            f"got {describe(value)}"
        )
    if value.get("type") != "function":
        bad(f"body.{key}.type must be 'function', got {show(value.get('type'))}")
    function = value.get("function")
    if not isinstance(function, Mapping):
        bad(
            f'body.{key}.function must be an object such as {{"name": "my_function"}}, '
            f"got {describe(function)}"
        )
    name = function.get("name")
    if not isinstance(name, str) or not name:
        got = "it is missing" if "name" not in function else f"got {describe(name)}"
        bad(f"body.{key}.function.name must be a non-empty string; {got}")


def check_forced_combination(body: Mapping[str, Any]) -> None:
    """Refuse a tool_choice that forces a call the body's tools cannot make."""
    choice = body.get("tool_choice")
    if choice is None or choice in ("none", "auto"):
        return
    tools = body.get("tools")
    if not tools:
        bad(f"body.tool_choice {_shown(choice)} needs body.tools, the functions it may call")
    names = [t["function"]["name"] for t in tools]
    name = forced_name(choice)
    if name is not None and name not in names:
        bad(
            f"body.tool_choice names the function {show(name)}, which is not in body.tools "
            f"(it holds {', '.join(show(n) for n in names)})"
        )
    if body.get("response_format") is not None and body["response_format"].get("type") != "text":
        # vLLM's server silently drops the response_format here; say so instead.
        bad(
            f"body.response_format cannot go with body.tool_choice {_shown(choice)}: the forced "
            "call's arguments are the constrained output; remove one of them"
        )
    if choice == "required":
        _check_defs_agree(tools)


def _check_defs_agree(tools: Sequence[Mapping[str, Any]]) -> None:
    """The tools' `$defs`, merged into one schema for "required", must not clash (as vLLM)."""
    seen: dict[str, Any] = {}
    for i, tool in enumerate(tools):
        params = tool["function"].get("parameters") or {}
        defs = params.get("$defs")
        if defs is None:
            continue
        if not isinstance(defs, dict):
            bad(
                f"body.tools[{i}].function.parameters.$defs must be an object, got {describe(defs)}"
            )
        for name, schema in defs.items():
            if name in seen and seen[name] != schema:
                bad(
                    f"body.tools[{i}].function.parameters.$defs defines {show(name)} differently "
                    'from an earlier tool; tool_choice "required" merges the tools\' $defs'
                )
            seen[name] = schema


def _shown(choice: object) -> str:
    return show(choice) if isinstance(choice, str) else "naming a function"


def forced_answer(
    forced: ForcedCall, text: str, finish_reason: str, call_id: str
) -> tuple[str, list[dict[str, Any]] | None, str]:
    """A choice's text, tool calls and finish reason for an answer generated under `forced`.

    As vLLM's server (and OpenAI): a "required" call ends in "tool_calls", a named one in
    "stop". An answer cut short holds no whole call: its text stays the content, with "length".
    """
    calls = read_forced_calls(forced, text, call_id)
    if calls is None:
        return text, None, finish_reason
    if forced.name is None and finish_reason == "stop":
        finish_reason = "tool_calls"
    return "", calls, finish_reason
