"""Tool calls: earlier calls shaped for the chat template, and calls parsed out of a reply."""

from __future__ import annotations

import contextlib
import json
import re
import uuid
from collections.abc import Mapping
from typing import Any


def template_tool_call(call: object) -> object:
    """An earlier assistant tool call, with its JSON `arguments` string parsed (as templates want)."""
    if not isinstance(call, Mapping) or not isinstance(call.get("function"), Mapping):
        return call
    function = dict(call["function"])
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        # Not JSON: the template gets the string as it is.
        with contextlib.suppress(ValueError):
            function["arguments"] = json.loads(arguments)
    return {**call, "function": function}


_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def parse_tool_calls(text: str) -> tuple[str, list[dict[str, Any]] | None]:
    """Split `<tool_call>{"name", "arguments"}</tool_call>` blocks (the Hermes format that most
    tool-trained open models and their chat templates use) from a reply.

    Returns the remaining text and OpenAI-shaped tool calls, or the text untouched and None when
    the reply holds no well-formed call.
    """
    calls: list[dict[str, Any]] = []
    for match in _TOOL_CALL.finditer(text):
        try:
            call = json.loads(match.group(1))
        except ValueError:
            return text, None
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return text, None
        arguments = call.get("arguments", call.get("parameters", {}))
        calls.append(
            {
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {
                    "name": call["name"],
                    "arguments": arguments
                    if isinstance(arguments, str)
                    else json.dumps(arguments, ensure_ascii=False),
                },
            }
        )
    if not calls:
        return text, None
    return _TOOL_CALL.sub("", text).strip(), calls
