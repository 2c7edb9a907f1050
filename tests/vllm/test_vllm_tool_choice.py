"""Forced tool calls on the real engine: sample_data/chat_tool_choice.jsonl, lines 36-38 of the
shared chat job (tests/support/vllm_jobs.py), on the default model, whose chat template has no place for
tools: the structured-output constraint alone makes the answer a call of the listed tools."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
from support.openai_checks import parse_body
from support.vllm_jobs import TOOL_CHOICE_SAMPLE, chat_job_part

from batchrun.openai.records import CHAT

pytestmark = pytest.mark.vllm


@pytest.fixture
def tool_job(vllm_chat_job: dict[str, Any]) -> dict[str, Any]:
    return chat_job_part(vllm_chat_job, TOOL_CHOICE_SAMPLE)


def _schema(request: dict[str, Any], name: str) -> dict[str, Any]:
    fn = next(t["function"] for t in request["tools"] if t["function"]["name"] == name)
    schema: dict[str, Any] = fn["parameters"]
    return schema


def test_forced_calls_are_calls_of_the_listed_tools(tool_job: dict[str, Any]) -> None:
    assert tool_job["errors"] == {}
    assert [tool_job["lines"][cid] for cid in tool_job["requests"]] == [36, 37, 38]
    bodies = {
        cid: parse_body(CHAT, out["response"]["body"]) for cid, out in tool_job["outputs"].items()
    }
    # Named: a call of get_weather whose arguments follow its schema; it ends in "stop".
    named = bodies["tool-named"].choices[0]
    assert named.finish_reason == "stop" and named.message.content is None
    (call,) = named.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather"
    request = tool_job["requests"]["tool-named"]
    jsonschema.validate(json.loads(call.function.arguments), _schema(request, "get_weather"))
    # Required, one call at most (parallel_tool_calls false): "tool_calls".
    required = bodies["tool-required"].choices[0]
    assert required.finish_reason == "tool_calls" and required.message.content is None
    (call,) = required.message.tool_calls
    request = tool_job["requests"]["tool-required"]
    assert call.function.name in {"get_weather", "get_time"}
    jsonschema.validate(json.loads(call.function.arguments), _schema(request, call.function.name))
    # Cut by max_tokens 3: no whole call, the partial text is the content.
    cut = bodies["tool-required-cut"].choices[0]
    assert cut.finish_reason == "length" and cut.message.tool_calls is None
    assert cut.message.content is not None and cut.message.content.startswith("[")
    assert bodies["tool-required-cut"].usage.completion_tokens == 3
