"""/v1/responses and --reasoning-parser without a model: the request rules, the input as vLLM's
server builds its chat messages, the `Response` body (openai's type), chat answers' reasoning
fields through vLLM's real parser code, and the whole pipeline on the echo engine. The real engine
runs them in tests/vllm/test_vllm_responses.py."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from openai.types.chat import ChatCompletion
from openai.types.responses import Response
from support.cli import cli
from support.jobs import submit_echo
from support.lines import chat_line, line_error, write_jsonl
from support.models import default_model_dir
from support.openai_checks import assert_no_extra, output_lines, requests_of
from support.paths import ROOT

from batchrun.openai.params import OutputFormat, Sampling, sampling
from batchrun.openai.reader import read_input
from batchrun.openai.records import CHAT, RESPONSES, Request
from batchrun.openai.response_bodies import Choice, success
from batchrun.openai.responses_api import responses_messages
from batchrun.openai.vllm_sampling import VllmSampling

SAMPLE = ROOT / "sample_data" / "responses.jsonl"


def line(**body: Any) -> dict[str, Any]:
    return {"custom_id": "a", "method": "POST", "url": RESPONSES, "body": {"model": "m", **body}}


def error_of(tmp_path: Path, obj: dict[str, Any]) -> str:
    return line_error(tmp_path, obj).message


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({}, "body.input is missing; a responses request needs a string or a list of input items"),
        ({"input": ""}, "body.input must not be empty"),
        ({"input": []}, "body.input must not be an empty array"),
        ({"input": 3}, "body.input must be a string or an array of input items, got a number 3"),
        (
            {"input": [{"role": "tool", "content": "x"}]},
            "body.input[0].role must be one of user, system, developer, assistant; got 'tool'",
        ),
        (
            {"input": [{"type": "reasoning", "summary": []}]},
            "body.input[0].type 'reasoning' is not supported: batchrun takes the input items "
            "'message', 'function_call' and 'function_call_output'",
        ),
        (
            {"input": [{"type": "function_call_output", "call_id": "c", "output": 1}]},
            "body.input[0].output must be a string for an item of type 'function_call_output', "
            "got a number 1",
        ),
        (
            {"input": "x", "text": {"format": {"type": "json_schema", "name": "n"}}},
            "body.text.format.schema must be a JSON Schema object for type 'json_schema'; it is "
            "missing",
        ),
        (
            {"input": "x", "text": {"verbosity": "low"}},
            "body.text.verbosity is not supported: only OpenAI's own models take it; remove it",
        ),
        (
            {"input": "x", "reasoning": {"effort": "max"}},
            "body.reasoning.effort must be one of none, minimal, low, medium, high, xhigh, got "
            "'max'",
        ),
        (
            {"input": "x", "reasoning": {"summary": "auto"}},
            "body.reasoning.summary is not supported: a local model's reasoning is returned whole "
            "(a reasoning item with --reasoning-parser), never summarised; remove it",
        ),
        (
            {"input": "x", "max_output_tokens": 0},
            "body.max_output_tokens must be between 1 and 1000000, got 0",
        ),
        (
            {"input": "x", "truncation": "auto"},
            "body.truncation 'auto' is not supported: batchrun never cuts a prompt; a prompt "
            "longer than the context is a context_length_exceeded error; use 'disabled' or "
            "remove it",
        ),
        (
            {"input": "x", "background": True},
            "body.background is not supported: a batch already runs in the background; remove it",
        ),
        (
            {"input": "x", "stream": True},
            "stream is not supported in a batch; remove body.stream or set it to false",
        ),
        # vLLM's extensions are checked as on chat.
        (
            {"input": "x", "use_beam_search": True},
            "body.use_beam_search is not supported: batchrun samples; it runs no beam search; "
            "remove it",
        ),
        (
            {"input": "x", "min_tokens": 9, "max_output_tokens": 8},
            "body.min_tokens 9 is more than the answer's limit of 8 tokens (max_tokens); lower "
            "it or raise max_tokens",
        ),
        ({"input": "x", "seed": 1.5}, "body.seed must be a whole number, got a number 1.5"),
        (
            {"input": "x", "chat_template_kwargs": {"tokenize": False}},
            "body.chat_template_kwargs.tokenize is not a template variable a request may set: "
            "batchrun renders the prompt with it itself; remove it",
        ),
    ],
)
def test_a_field_that_cannot_be_honoured_is_refused_by_name(
    tmp_path: Path, body: dict[str, Any], message: str
) -> None:
    assert error_of(tmp_path, line(**body)) == message


def test_the_sampling_fields_are_typed() -> None:
    schema = {"type": "object"}
    body = {
        "input": "x", "max_output_tokens": 9, "temperature": 0, "top_p": 0.5,
        "text": {"format": {"type": "json_schema", "name": "n", "schema": schema}},
    }  # fmt: skip
    assert sampling(Request("a", 1, RESPONSES, body)) == Sampling(
        max_tokens=9, temperature=0.0, top_p=0.5, output_format=OutputFormat("json_schema", schema)
    )
    fmt = {"format": {"type": "json_object"}}
    assert sampling(Request("a", 1, RESPONSES, {"input": "x", "text": fmt})).output_format == (
        OutputFormat("json_object")
    )


def test_vllms_extensions_of_the_responses_api_are_read() -> None:
    """vLLM's Responses endpoint also takes chat's seed, stop, penalties and logit_bias, and its
    sampling extensions: honoured as on chat (a line of ours must not answer otherwise)."""
    body = {
        "input": "x", "seed": 7, "stop": "END", "presence_penalty": 0.5, "frequency_penalty": -1,
        "logit_bias": {"28": 5}, "top_k": 3, "ignore_eos": True,
    }  # fmt: skip
    assert sampling(Request("a", 1, RESPONSES, body)) == Sampling(
        seed=7,
        stop=("END",),
        presence_penalty=0.5,
        frequency_penalty=-1.0,
        logit_bias={28: 5.0},
        vllm=VllmSampling(top_k=3, ignore_eos=True),
    )
    assert sampling(Request("a", 1, RESPONSES, {"input": "x"})) == Sampling()


@pytest.mark.parametrize("custom_id", ["plain", "items", "history"])
@pytest.mark.slow
def test_the_input_becomes_the_chat_messages_vllms_server_builds(custom_id: str) -> None:
    from vllm.entrypoints.openai.responses.protocol import ResponsesRequest
    from vllm.entrypoints.openai.responses.utils import construct_input_messages

    body = requests_of(SAMPLE)[custom_id]
    request = ResponsesRequest.model_validate(copy.deepcopy(body))  # it converts items in place
    theirs = construct_input_messages(
        request_instructions=request.instructions, request_input=request.input
    )
    ours = responses_messages(body)
    # vLLM keeps content parts as parts (its renderer joins their text with newlines, as ours)
    # and an item's "type" (its renderer reads role and content only).
    for message in theirs:
        if isinstance(message.get("content"), list):
            message["content"] = "\n".join(p["text"] for p in message["content"])
        for call in message.get("tool_calls") or ():
            call["function"] = dict(call["function"])
    normalised = [
        {k: v for k, v in dict(m).items() if v is not None and k != "type"} for m in theirs
    ]
    assert [{k: v for k, v in m.items() if v is not None} for m in ours] == normalised


def test_a_response_with_reasoning_parses_as_the_openai_type() -> None:
    request = Request("a", 1, RESPONSES, {"input": "x", "metadata": {"k": "v"}})
    choice = Choice("4", "stop", 6, reasoning="2 plus 2", reasoning_tokens=3)
    outcome = success(request, [choice], model="m", prompt_tokens=4, latency_s=0, reasoning=True)
    assert isinstance(outcome.body, dict)
    response = Response.model_validate(outcome.body, strict=True)
    assert_no_extra(response)
    assert [item.type for item in response.output] == ["reasoning", "message"]
    assert response.output_text == "4" and response.metadata == {"k": "v"}
    assert response.usage is not None and response.usage.output_tokens_details.reasoning_tokens == 3


def test_cached_prompt_tokens_are_reported_where_openai_reports_them() -> None:
    """An engine's prefix-cache count goes into each body's usage; an engine without a cache
    (None) leaves chat and completions usage without the details, as before."""
    chat = Request("c", 1, CHAT, chat_line("c", "hi")["body"])
    body = success(chat, [Choice("yo", "stop", 1)], model="m", prompt_tokens=40, latency_s=0,
                   cached_tokens=32).body  # fmt: skip
    assert isinstance(body, dict)
    usage = ChatCompletion.model_validate(body, strict=True).usage
    assert usage is not None and usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == 32
    plain = success(chat, [Choice("yo", "stop", 1)], model="m", prompt_tokens=40, latency_s=0)
    assert isinstance(plain.body, dict) and "prompt_tokens_details" not in plain.body["usage"]
    resp = Request("r", 1, RESPONSES, {"input": "x"})
    body = success(resp, [Choice("yo", "stop", 1)], model="m", prompt_tokens=40, latency_s=0,
                   cached_tokens=16).body  # fmt: skip
    response = Response.model_validate(body, strict=True)
    assert response.usage is not None and response.usage.input_tokens_details.cached_tokens == 16


@pytest.mark.slow
def test_chat_reasoning_comes_from_vllms_parser_and_parses_as_a_chat_completion() -> None:
    from transformers import AutoTokenizer

    from batchrun.engines.vllm.reasoning import Reasoner, ReasoningParserError

    tokenizer = AutoTokenizer.from_pretrained(str(default_model_dir()))
    reasoner = Reasoner("qwen3", tokenizer, None)
    text = "<think>2 plus 2 is 4.</think>\n\nIt is 4."
    reasoning, content, count = reasoner.split(text, tokenizer.encode(text), {})
    assert (reasoning, content) == ("2 plus 2 is 4.", "\n\nIt is 4.")
    assert count > 0
    # Thinking switched off in the template: vLLM's qwen3 parser reads it all as content.
    assert reasoner.split("Paris.", tokenizer.encode("Paris."), {"enable_thinking": False})[:2] == (
        None,
        "Paris.",
    )
    request = Request("a", 1, CHAT, chat_line("a", "hi")["body"])
    choices = [Choice(content, "stop", 12, reasoning=reasoning, reasoning_tokens=count)]
    outcome = success(request, choices, model="m", prompt_tokens=3, latency_s=0, reasoning=True)
    assert isinstance(outcome.body, dict)
    body = ChatCompletion.model_validate(outcome.body)
    message = outcome.body["choices"][0]["message"]
    # As vLLM's server sends them: `reasoning` beside the content, reasoning tokens in usage.
    assert message["reasoning"] == "2 plus 2 is 4." and body.choices[0].message.content == content
    assert body.usage is not None and body.usage.completion_tokens_details is not None
    assert body.usage.completion_tokens_details.reasoning_tokens == count
    with pytest.raises(ReasoningParserError) as err:
        Reasoner("qwen9", tokenizer, None)
    assert str(err.value).startswith(
        "--reasoning-parser 'qwen9' is not one of vLLM's reasoning parsers: cohere_command3, "
    )
    with pytest.raises(ReasoningParserError) as err:
        Reasoner("deepseek_r1", tokenizer, None)
    assert str(err.value) == (
        "--reasoning-parser deepseek_r1 cannot read this model's output: DeepSeekR1ReasoningParser "
        "reasoning parser could not locate think start/end tokens in the tokenizer!"
    )


def test_the_sample_runs_on_the_echo_engine_with_reasoning_in_parquet(tmp_path: Path) -> None:
    src = write_jsonl(
        tmp_path / "in.jsonl",
        [
            *[x for x in SAMPLE.read_text().splitlines() if x.strip()],
            {**line(input="<think>easy</think> Paris", model="gpt-4o-mini"), "custom_id": "think"},
        ],
    )
    job = tmp_path / "job"
    run = submit_echo(src, job, "--reasoning-parser", "qwen3")
    assert run.returncode == 1, run.stderr[-3000:]  # the sample's refused lines
    assert cli("export", "--job-dir", str(job)).returncode == 0
    assert cli("export", "--job-dir", str(job), "--parquet").returncode == 0
    outputs = output_lines(job / "output.jsonl")
    assert set(outputs) == {
        "plain",
        "items",
        "history",
        "json-object",
        "json-schema",
        "cut",
        "think",
    }
    for out in outputs.values():
        assert_no_extra(Response.model_validate(out["response"]["body"], strict=True))
    errors = output_lines(job / "errors.jsonl")
    assert set(errors) == {"refused-tools", "refused-previous", "refused-image"}
    df = pd.read_parquet(job / "results.parquet").set_index("custom_id")
    assert (df.loc["think", "reasoning"], df.loc["think", "content"]) == ("easy", "Paris")
    assert df.loc["items", "content"] == "Name a primary color."
    assert pd.isna(df.loc["items", "reasoning"])
    assert (df.loc["cut", "finish_reason"], df.loc["cut", "completion_tokens"]) == ("length", 5)


def test_tools_in_chat_template_kwargs_are_advised_where_tools_run(tmp_path: Path) -> None:
    """The refusal's advice works when followed: chat's ("give tools as body.tools") gives a
    valid chat line; responses' is not chat's, which would give a line refused again."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    on_responses = line(input="Hi", chat_template_kwargs={"tools": tools})
    assert error_of(tmp_path, on_responses) == (
        "body.chat_template_kwargs.tools is not a template variable a request may set: batchrun "
        "renders the prompt with it itself; remove it: tools are not run on /v1/responses; use "
        "/v1/chat/completions, where function tools and tool_choice are honoured"
    )
    # Followed: without it the line is valid; with tools it must go to chat, where they run.
    (plain,) = read_input(write_jsonl(tmp_path / "in.jsonl", [line(input="Hi")]))
    assert isinstance(plain, Request)
    assert error_of(tmp_path, line(input="Hi", tools=tools)).startswith("body.tools is not")
    on_chat = chat_line("a", "Hi", chat_template_kwargs={"tools": tools})
    assert error_of(tmp_path, on_chat).endswith("; give tools as body.tools")
    (fixed,) = read_input(write_jsonl(tmp_path / "in.jsonl", [chat_line("a", "Hi", tools=tools)]))
    assert isinstance(fixed, Request) and fixed.body["tools"] == tools
