"""Forced tool calls (`tool_choice: "required"` or a named function): the request rules, the
constraint (the JSON Schema vLLM's own server builds), the calls read back, and the echo engine's
answers parsed with the openai types. The real engine runs sample_data/chat_tool_choice.jsonl in
the shared chat job (tests/vllm/test_vllm_tool_choice.py)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from support.cli import cli
from support.jobs import submit_echo
from support.lines import line_error
from support.openai_checks import output_lines, parse_body
from support.paths import ROOT

from batchrun.openai.params import sampling
from batchrun.openai.records import CHAT, Request
from batchrun.openai.toolchoice import ForcedCall, forced_answer, forced_call

SAMPLE = ROOT / "sample_data" / "chat_tool_choice.jsonl"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time"}}
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def body(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "Hi"}], **fields}


def error_of(tmp_path: Path, fields: dict[str, Any]) -> str:
    line = {"custom_id": "a", "method": "POST", "url": CHAT, "body": body(**fields)}
    out = line_error(tmp_path, line)
    assert out.code == "invalid_request"
    return out.message


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"tool_choice": "required"},
            "body.tool_choice 'required' needs body.tools, the functions it may call",
        ),
        (
            {"tool_choice": NAMED},
            "body.tool_choice naming a function needs body.tools, the functions it may call",
        ),
        (
            {"tools": [TIME], "tool_choice": NAMED},
            "body.tool_choice names the function 'get_weather', which is not in body.tools (it "
            "holds 'get_time')",
        ),
        (
            {"tools": [TIME], "tool_choice": "any"},
            "body.tool_choice must be 'none', 'auto', 'required' or an object naming a function, "
            "got a string 'any'",
        ),
        (
            {"tools": [TIME], "tool_choice": {"type": "function"}},
            'body.tool_choice.function must be an object such as {"name": "my_function"}, got null',
        ),
        (
            {"tools": [TIME], "tool_choice": {"type": "function", "function": {"name": ""}}},
            "body.tool_choice.function.name must be a non-empty string; got a string ''",
        ),
        (
            {"tools": [TIME], "tool_choice": {"type": "custom", "custom": {"name": "x"}}},
            "body.tool_choice.type must be 'function', got 'custom'",
        ),
        (
            {
                "tools": [WEATHER],
                "tool_choice": "required",
                "response_format": {"type": "json_object"},
            },
            "body.response_format cannot go with body.tool_choice 'required': the forced call's "
            "arguments are the constrained output; remove one of them",
        ),
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {"name": "a", "parameters": {"$defs": {"X": {}}}},
                    },
                    {
                        "type": "function",
                        "function": {
                            "name": "b",
                            "parameters": {"$defs": {"X": {"type": "string"}}},
                        },
                    },
                ],
                "tool_choice": "required",
            },
            "body.tools[1].function.parameters.$defs defines 'X' differently from an earlier "
            'tool; tool_choice "required" merges the tools\' $defs',
        ),
    ],
)
def test_a_forced_call_the_tools_cannot_make_is_refused_naming_the_field(
    tmp_path: Path, fields: dict[str, Any], message: str
) -> None:
    assert error_of(tmp_path, fields) == message


def _vllm_schema(fields: dict[str, Any]) -> Any:
    """The schema vLLM's own server builds for the same request (its protocol types and code)."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.tool_parsers.utils import get_json_schema_from_tools

    request = ChatCompletionRequest.model_validate(copy.deepcopy(body(**fields)))
    return get_json_schema_from_tools(
        request.tool_choice, request.tools, request.parallel_tool_calls
    )


@pytest.mark.parametrize(
    "fields",
    [
        {"tools": [WEATHER, TIME], "tool_choice": NAMED},
        {
            "tools": [WEATHER, TIME],
            "tool_choice": {"type": "function", "function": {"name": "get_time"}},
        },
        {"tools": [WEATHER, TIME], "tool_choice": "required"},
        {"tools": [WEATHER, TIME], "tool_choice": "required", "parallel_tool_calls": False},
        {
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": "f",
                        "parameters": {
                            "type": "object",
                            "properties": {"p": {"$ref": "#/$defs/P"}},
                            "$defs": {"P": {"type": "integer"}},
                        },
                    },
                }
            ],
            "tool_choice": "required",
        },
    ],
)
def test_the_constraint_is_the_schema_vllms_server_builds(fields: dict[str, Any]) -> None:
    forced = forced_call(body(**fields))
    assert forced is not None
    assert forced.schema == _vllm_schema(fields)
    # The body is left as it was ($defs are moved in a copy).
    assert forced_call(body(**fields)) == forced


def test_only_a_forced_choice_constrains_and_auto_still_parses_replies() -> None:
    def params(**fields: Any) -> Any:
        return sampling(Request("a", 1, CHAT, body(**fields)))

    assert params(tools=[TIME]).forced_call is None and params(tools=[TIME]).tools is True
    assert params(tools=[TIME], tool_choice="none").tools is False
    named = params(tools=[WEATHER], tool_choice=NAMED)
    assert named.tools is False
    assert named.forced_call == ForcedCall(WEATHER["function"]["parameters"], "get_weather")  # type: ignore[index]


def test_a_forced_answer_becomes_calls_with_the_finish_reasons_of_vllm_and_openai() -> None:
    named = ForcedCall({"type": "object"}, "get_weather")
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    # Named: the whole answer is the arguments, as written; it ends in "stop".
    assert forced_answer(named, '{"city": "Paris"}', "stop", "call_1") == ("", [call], "stop")
    required = ForcedCall({"type": "array"})
    text = '[{"name": "get_weather", "parameters": {"city": "Paris"}}, {"name": "get_time", "parameters": {}}]'
    second = {
        "id": "call_1_1",
        "type": "function",
        "function": {"name": "get_time", "arguments": "{}"},
    }
    assert forced_answer(required, text, "stop", "call_1") == ("", [call, second], "tool_calls")
    # Cut short by max_tokens: no whole call; the text stays the content.
    assert forced_answer(required, '[{"na', "length", "call_1") == ('[{"na', None, "length")
    assert forced_answer(named, "", "length", "call_1") == ("", None, "length")


def test_the_sample_runs_on_the_echo_engine_and_parses_as_chat_completions(tmp_path: Path) -> None:
    job = tmp_path / "job"
    run = submit_echo(SAMPLE, job)
    assert run.returncode == 0, run.stderr[-3000:]
    assert cli("export", "--job-dir", str(job)).returncode == 0
    outputs = output_lines(job / "output.jsonl")
    answers = {cid: parse_body(CHAT, out["response"]["body"]) for cid, out in outputs.items()}
    named = answers["tool-named"].choices[0]
    assert named.finish_reason == "stop" and named.message.content is None
    assert [(c.function.name, c.function.arguments) for c in named.message.tool_calls] == [
        ("get_weather", "{}")
    ]
    required = answers["tool-required"].choices[0]
    assert required.finish_reason == "tool_calls"
    assert [(c.function.name, c.function.arguments) for c in required.message.tool_calls] == [
        ("get_weather", "{}")  # the echo engine calls the first tool
    ]
    ids = [a.choices[0].message.tool_calls[0].id for a in answers.values()]
    assert len(set(ids)) == len(ids) and all(i.startswith("call_") for i in ids)


def test_results_parquet_holds_the_calls_output_jsonl_holds(tmp_path: Path) -> None:
    """A forced call's content is null: its calls are in the `tool_calls` column, as written."""
    import pandas as pd

    job = tmp_path / "job"
    run = submit_echo(SAMPLE, job)
    assert run.returncode == 0, run.stderr[-3000:]
    assert cli("export", "--job-dir", str(job)).returncode == 0
    assert cli("export", "--job-dir", str(job), "--parquet").returncode == 0
    df = pd.read_parquet(job / "results.parquet").set_index("custom_id")
    for cid, out in output_lines(job / "output.jsonl").items():
        message = out["response"]["body"]["choices"][0]["message"]
        expected = [
            {"id": c["id"], "type": c["type"], **c["function"]}
            for c in message.get("tool_calls") or []
        ]
        got = df.loc[cid, "tool_calls"]
        assert ([dict(c) for c in got] if got is not None else []) == expected, cid
    assert df.loc["tool-named", "tool_calls"] is not None
    assert pd.isna(df.loc["tool-named", "content"])
