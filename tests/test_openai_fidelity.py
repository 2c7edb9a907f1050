"""OpenAI Batch API fidelity without a model: the request rules, the response shapes, embeddings.

The shapes are checked with the openai package's own types in strict mode; the whole pipeline
(reader -> worker -> journal -> export) runs the sample files on the echo engine. The real engine
runs the same samples in tests/vllm/test_vllm_fidelity.py.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd
import pyarrow.parquet as pq
import pytest
from support.cli import cli
from support.jobs import submit_echo
from support.lines import line_error, read_lines, write_jsonl
from support.openai_checks import check_against_request, output_lines, parse_body, requests_of
from support.paths import ROOT

from batchrun.engines.echo import ECHO_DIMENSIONS, echo_vector
from batchrun.engines.vllm.prompts import template_takes
from batchrun.engines.vllm.tokens import TokenText, byte_decoder
from batchrun.engines.vllm.tools import parse_tool_calls
from batchrun.export.embeddings import as_requested
from batchrun.export.job import export_parquet
from batchrun.job.journal import JournalWriter, result_record
from batchrun.openai.reader import read_input
from batchrun.openai.records import CHAT, COMPLETIONS, EMBEDDINGS, LineError, Request
from batchrun.openai.response_bodies import (
    Choice,
    TokenLogprob,
    decode_base64,
    embedding_success,
    encode_base64,
    success,
)

SAMPLES = ROOT / "sample_data"


def line(url: str, custom_id: str = "a", **body: Any) -> dict[str, Any]:
    """One input line for `url`, with a minimal valid body plus `body`."""
    base: dict[str, Any] = {"model": "m"}
    if url == CHAT:
        base["messages"] = [{"role": "user", "content": "Hi"}]
    elif url == COMPLETIONS:
        base["prompt"] = "Once"
    else:
        base["input"] = "hello"
    base.update(body)
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": base}


# --- request rules ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "body"),
    [
        (CHAT, {"logprobs": True, "top_logprobs": 20}),
        (CHAT, {"logprobs": False}),
        (CHAT, {"logit_bias": {"50256": -100, "11": 2.5}}),
        (CHAT, {"response_format": {"type": "text"}}),
        (CHAT, {"response_format": {"type": "json_object"}}),
        (
            CHAT,
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "object"}, "strict": True},
                }
            },
        ),
        (CHAT, {"user": "u1", "metadata": {"k": "v"}, "store": False, "service_tier": "auto"}),
        (CHAT, {"modalities": ["text"], "parallel_tool_calls": False, "tool_choice": "auto"}),
        (CHAT, {"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}),
        (CHAT, {"audio": None, "prediction": None, "stream_options": None}),
        (COMPLETIONS, {"logprobs": 5}),
        (COMPLETIONS, {"echo": True, "logprobs": None}),
        (COMPLETIONS, {"logprobs": 0, "n": 2, "best_of": 2, "user": "u"}),
        (COMPLETIONS, {"response_format": {"type": "json_object"}}),
        (EMBEDDINGS, {"input": ["a", "b"], "encoding_format": "base64", "dimensions": 8}),
        (EMBEDDINGS, {"input": [1, 2, 3], "encoding_format": "float", "user": "u"}),
        (EMBEDDINGS, {"input": [[1, 2], [3]]}),
        # vLLM's sampling extensions, honoured as vLLM's server honours them.
        (CHAT, {"top_k": -1, "min_p": 0.05, "repetition_penalty": 1.1, "ignore_eos": True}),
        (CHAT, {"min_tokens": 8, "max_completion_tokens": 8, "stop_token_ids": [2, 0]}),
        (CHAT, {"bad_words": ["x y"], "allowed_token_ids": [5], "skip_special_tokens": False}),
        (CHAT, {"use_beam_search": False, "watermarking": False, "prompt_logprobs": None}),
        (COMPLETIONS, {"top_k": 1, "min_tokens": 16, "include_stop_str_in_output": True}),
        (COMPLETIONS, {"spaces_between_special_tokens": False, "stop_token_ids": []}),
    ],
)
def test_fields_that_are_honoured_pass_validation(
    tmp_path: Path, url: str, body: dict[str, Any]
) -> None:
    obj = line(url, **body)
    assert read_lines(tmp_path, obj) == [Request("a", 1, url, obj["body"])]


@pytest.mark.parametrize(
    ("url", "body", "message"),
    [
        (
            CHAT,
            {"top_logprobs": 2},
            "body.top_logprobs needs body.logprobs set to true",
        ),
        (
            CHAT,
            {"logprobs": True, "top_logprobs": 21},
            "body.top_logprobs must be between 0 and 20, got 21",
        ),
        (CHAT, {"logprobs": 1}, "body.logprobs must be true or false, got a number 1"),
        (COMPLETIONS, {"logprobs": 6}, "body.logprobs must be between 0 and 5, got 6"),
        (
            COMPLETIONS,
            {"logprobs": True},
            "body.logprobs must be a whole number, got a boolean true",
        ),
        (
            CHAT,
            {"logit_bias": {"abc": 1}},
            "body.logit_bias keys must be token ids written as strings such as \"50256\", got 'abc'",
        ),
        (
            CHAT,
            {"logit_bias": {"5": 101}},
            "body.logit_bias['5'] must be between -100 and 100, got 101",
        ),
        (
            CHAT,
            {"response_format": {"type": "yaml"}},
            "body.response_format.type must be one of text, json_object, json_schema; got 'yaml'",
        ),
        (
            CHAT,
            {"response_format": {"type": "json_schema"}},
            "body.response_format.json_schema must be an object with a name and a schema for a "
            "response_format of type 'json_schema'; it is missing",
        ),
        (
            CHAT,
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": 1}}},
            "body.response_format.json_schema.schema must be a JSON Schema object, got a number 1",
        ),
        (CHAT, {"metadata": {"k": 1}}, "body.metadata['k'] must be a string, got a number 1"),
        (
            CHAT,
            {"metadata": {str(i): "v" for i in range(17)}},
            "body.metadata may hold at most 16 keys, got 17",
        ),
        (CHAT, {"user": 5}, "body.user must be a string, got a number 5"),
        (
            CHAT,
            {"audio": {"voice": "alloy", "format": "wav"}},
            "body.audio is not supported: batchrun runs text models, which produce no audio; "
            "remove it",
        ),
        (
            CHAT,
            {"modalities": ["text", "audio"]},
            "body.modalities asks for audio output, which batchrun cannot produce (it runs text "
            'models); use ["text"] or remove the field',
        ),
        (
            CHAT,
            {"stream_options": {"include_usage": True}},
            "body.stream_options is not supported: it only applies to stream, which a batch does "
            "not support; remove it",
        ),
        (
            CHAT,
            {"functions": [{"name": "f"}]},
            "body.functions is not supported: the deprecated functions API is not run; pass "
            "body.tools instead; remove it",
        ),
        (
            CHAT,
            {"tool_choice": "required"},
            "body.tool_choice 'required' needs body.tools, the functions it may call",
        ),
        (
            CHAT,
            {"tools": [{"type": "web_search"}]},
            "body.tools[0].type must be 'function' (the only kind of tool a local model can be "
            "given), got 'web_search'",
        ),
        (
            CHAT,
            {"prediction": {"type": "content", "content": "x"}},
            "body.prediction is not supported: predicted outputs are an OpenAI service feature "
            "vLLM does not have; remove it",
        ),
        (CHAT, {"top_k": -2}, "body.top_k must be 0 or -1 (no limit) or at least 1, got -2"),
        (CHAT, {"top_k": 1.5}, "body.top_k must be a whole number, got a number 1.5"),
        (CHAT, {"min_p": 1.5}, "body.min_p must be at least 0 and at most 1, got 1.5"),
        (
            CHAT,
            {"repetition_penalty": 0},
            "body.repetition_penalty must be greater than 0 (1 is no penalty), got 0",
        ),
        (CHAT, {"ignore_eos": "yes"}, "body.ignore_eos must be true or false, got a string 'yes'"),
        (
            CHAT,
            {"stop_token_ids": [1, -3]},
            "body.stop_token_ids[1] must be a token id (a whole number >= 0), got -3",
        ),
        (
            CHAT,
            {"allowed_token_ids": []},
            "body.allowed_token_ids must not be empty: it names the only tokens the answer may "
            "hold",
        ),
        (CHAT, {"bad_words": [""]}, "body.bad_words[0] must be a non-empty string, got ''"),
        (
            CHAT,
            {"min_tokens": 9, "max_tokens": 4, "max_completion_tokens": 8},
            "body.min_tokens 9 is more than the answer's limit of 8 tokens (max_tokens); lower "
            "it or raise max_tokens",
        ),
        (
            COMPLETIONS,
            {"min_tokens": 17},
            "body.min_tokens 17 is more than the answer's limit of 16 tokens (max_tokens); lower "
            "it or raise max_tokens",
        ),
        (
            CHAT,
            {"use_beam_search": True},
            "body.use_beam_search is not supported: batchrun samples; it runs no beam search; "
            "remove it",
        ),
        (
            COMPLETIONS,
            {"prompt_logprobs": 1},
            "body.prompt_logprobs is not supported: answers carry no prompt logprobs; remove it",
        ),
        (
            CHAT,
            {"structured_outputs": {"json": {}}},
            "body.structured_outputs is not supported: give the constraint as "
            "body.response_format; remove it",
        ),
        (
            COMPLETIONS,
            {"suffix": "end"},
            "body.suffix is not supported: vLLM cannot insert text between a prompt and a "
            "suffix; remove it",
        ),
        (
            COMPLETIONS,
            {"best_of": 3},
            "body.best_of 3 is not supported: only best_of equal to n (1) can be honoured (vLLM "
            "returns every sequence it samples); remove it",
        ),
        (
            COMPLETIONS,
            {"echo": True, "logprobs": 1},
            "body.echo together with body.logprobs is not supported: the prompt's first token "
            "has no logprob, which the Completion type cannot hold; drop one of them",
        ),
        (
            COMPLETIONS,
            {"stream": True},
            "stream is not supported in a batch; remove body.stream or set it to false",
        ),
        (EMBEDDINGS, {"input": ""}, "body.input must not be empty"),
        (EMBEDDINGS, {"input": []}, "body.input must not be an empty array"),
        (EMBEDDINGS, {"input": ["a", ""]}, "body.input[1] must not be empty"),
        (
            EMBEDDINGS,
            {"input": ["a", 1]},
            "body.input[1] must be a string like the items before it, got a number 1",
        ),
        (
            EMBEDDINGS,
            {"input": [1, -2]},
            "body.input[1] must be a token id (a whole number, 0 or more), got a number -2",
        ),
        (EMBEDDINGS, {"input": [[1], []]}, "body.input[1] must not be an empty array"),
        (
            EMBEDDINGS,
            {"input": {"text": "x"}},
            "body.input must be a string, an array of strings, an array of token ids or an array "
            "of token id arrays, got an object",
        ),
        (EMBEDDINGS, {"input": ["a"] * 2049}, "body.input may hold at most 2048 items, got 2049"),
        (
            EMBEDDINGS,
            {"encoding_format": "int8"},
            "body.encoding_format must be one of 'float', 'base64', got 'int8'",
        ),
        (EMBEDDINGS, {"dimensions": 0}, "body.dimensions must be at least 1, got 0"),
    ],
)
def test_fields_that_cannot_be_honoured_are_refused_with_the_field_and_why(
    tmp_path: Path, url: str, body: dict[str, Any], message: str
) -> None:
    assert line_error(tmp_path, line(url, **body)) == LineError(1, "a", "invalid_request", message)


@pytest.mark.parametrize("null", [False, True])
def test_embeddings_input_is_required(tmp_path: Path, null: bool) -> None:
    obj = line(EMBEDDINGS)
    if null:  # as an unset field: null means not set
        obj["body"]["input"] = None
    else:
        del obj["body"]["input"]
    assert line_error(tmp_path, obj).message == (
        "body.input is missing; an embeddings request needs a string or an array of them"
    )


def test_a_file_that_mixes_models_is_refused_per_line_with_the_first_models_line(
    tmp_path: Path,
) -> None:
    no_model = line(CHAT, "c")
    del no_model["body"]["model"]
    out = read_lines(
        tmp_path,
        line(CHAT, "a", model="gpt-4o"),
        line(CHAT, "b", model="gpt-4o-mini"),
        no_model,
        line(CHAT, "d", model="gpt-4o"),
        line(CHAT, "e", model=None),
        line(CHAT, "f", model="other"),
    )
    assert [(o.custom_id, type(o).__name__) for o in out] == [
        ("a", "Request"),
        ("b", "LineError"),
        ("c", "Request"),
        ("d", "Request"),
        ("e", "Request"),
        ("f", "LineError"),
    ]
    assert out[1] == LineError(
        2,
        "b",
        "mixed_models",
        "model 'gpt-4o-mini' differs from this file's model 'gpt-4o' (set by line 1); every line "
        "of a batch must use the same model",
    )
    assert isinstance(out[5], LineError) and out[5].line == 6


def test_sample_files_have_only_the_invalid_lines_they_mean_to_have() -> None:
    for name, refused in [
        (
            "chat_fidelity.jsonl",
            {"refused-stream", "refused-audio", "refused-top-logprobs-without-logprobs"},
        ),
        (
            "completions_fidelity.jsonl",
            {"refused-suffix", "refused-best-of", "refused-echo-logprobs"},
        ),
        ("embeddings.jsonl", {"refused-empty", "refused-format"}),
    ]:
        items = list(read_input(SAMPLES / name))
        invalid = {i.custom_id for i in items if isinstance(i, LineError)}
        assert invalid == refused, name


# --- response shapes -------------------------------------------------------------------------


def _req(url: str, **body: Any) -> Request:
    return Request("a", 1, url, line(url, **body)["body"])


def test_chat_logprobs_and_metadata_parse_as_a_chat_completion() -> None:
    tokens = [
        TokenLogprob("Hi", b"Hi", -0.1, (("Hi", b"Hi", -0.1), ("Yo", b"Yo", -2.5))),
        TokenLogprob("\u00e9", b"\xc3", float("-inf"), (("x", None, float("nan")),)),
    ]
    request = _req(CHAT, logprobs=True, top_logprobs=2, metadata={"k": "v"})
    outcome = success(
        request,
        [Choice("Hi\u00e9", "stop", 2, logprobs=tokens)],
        model="m",
        prompt_tokens=3,
        latency_s=0,
    )
    assert outcome.body is not None
    parsed = parse_body(CHAT, outcome.body)
    check_against_request(CHAT, request.body, parsed)
    content = parsed.choices[0].logprobs.content
    assert [t.token for t in content] == ["Hi", "\u00e9"]
    assert content[1].logprob == -9999.0 and content[1].bytes == [0xC3]  # JSON has no -inf
    assert content[0].top_logprobs[1].token == "Yo"
    assert (
        content[1].top_logprobs[0].logprob == -9999.0 and content[1].top_logprobs[0].bytes is None
    )
    assert parsed.metadata == {"k": "v"}
    json.dumps(outcome.body, allow_nan=False)  # the journal can hold it


def test_completion_logprobs_have_the_legacy_shape() -> None:
    tokens = [
        TokenLogprob(" a", b" a", -0.5, ((" b", b" b", -0.4), (" a", b" a", -0.5))),
        TokenLogprob("!", b"!", -1.0, ((".", b".", -0.2),)),
    ]
    request = _req(COMPLETIONS, logprobs=2, max_tokens=2)
    outcome = success(
        request,
        [Choice(" a!", "length", 2, logprobs=tokens)],
        model="m",
        prompt_tokens=1,
        latency_s=0,
    )
    assert outcome.body is not None
    parsed = parse_body(COMPLETIONS, outcome.body)
    check_against_request(COMPLETIONS, request.body, parsed)
    lp = parsed.choices[0].logprobs
    assert lp.tokens == [" a", "!"] and lp.token_logprobs == [-0.5, -1.0]
    assert lp.text_offset == [0, 2]
    # The sampled token is always among the top ones, as OpenAI's are.
    assert lp.top_logprobs == [{" b": -0.4, " a": -0.5}, {".": -0.2, "!": -1.0}]


def test_tool_calls_make_a_tool_calls_choice() -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    outcome = success(
        _req(CHAT),
        [Choice("", "tool_calls", 5, tool_calls=[call])],
        model="m",
        prompt_tokens=1,
        latency_s=0,
    )
    assert outcome.body is not None
    parsed = parse_body(CHAT, outcome.body)
    choice = parsed.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert choice.message.tool_calls[0].function.name == "f"


@pytest.mark.parametrize("encoding", ["float", "base64"])
def test_embeddings_parse_as_a_create_embedding_response(encoding: str) -> None:
    vectors = [echo_vector("x"), echo_vector([1, 2, 3])]
    request = _req(EMBEDDINGS, input=["x", "y"], encoding_format=encoding)
    outcome = embedding_success(request, vectors, model="m", prompt_tokens=4, latency_s=0)
    assert isinstance(outcome.body, dict) and outcome.completion_tokens == 0
    # Journaled as base64 float32 whatever was asked; a float request's body says so, first.
    assert all(isinstance(d["embedding"], str) for d in outcome.body["data"])
    assert next(iter(outcome.body)) == ("object" if encoding == "base64" else "export_encoding")
    exported = as_requested(outcome.body)
    parsed = parse_body(EMBEDDINGS, exported)
    check_against_request(EMBEDDINGS, request.body, parsed)
    assert [d.embedding for d in parsed.data] == vectors  # float32 values: base64 is exact
    assert parsed.usage.prompt_tokens == parsed.usage.total_tokens == 4
    raw = exported["data"][0]["embedding"]
    assert isinstance(raw, str if encoding == "base64" else list)


def test_base64_is_little_endian_float32() -> None:
    assert encode_base64([1.0, -2.0]) == "AACAPwAAAMA="
    assert decode_base64("AACAPwAAAMA=") == [1.0, -2.0]


def test_echo_vectors_are_deterministic_unit_vectors() -> None:
    v = echo_vector("hello")
    assert len(v) == ECHO_DIMENSIONS and v == echo_vector("hello") != echo_vector("hellO")
    assert math.isclose(sum(x * x for x in v), 1.0, rel_tol=1e-6)
    assert len(echo_vector("hello", 3)) == 3


# --- engine helpers that need no model -------------------------------------------------------


def test_hermes_tool_calls_are_split_from_the_reply() -> None:
    text, calls = parse_tool_calls(
        'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
        "</tool_call>"
    )
    assert text == "Let me look."
    assert calls is not None and len(calls) == 1
    assert calls[0]["type"] == "function" and calls[0]["id"].startswith("call_")
    assert calls[0]["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert parse_tool_calls("no calls here") == ("no calls here", None)
    broken = "<tool_call>{not json}</tool_call>"
    assert parse_tool_calls(broken) == (broken, None)


def test_template_takes_names_whole_words() -> None:
    assert template_takes("{% if tools %}{{ tools | tojson }}{% endif %}", "tools")
    assert not template_takes("{{ message['content'] }}", "tools")
    assert not template_takes("{{ toolset }}", "tools")


class _ByteLevelTokenizer:
    """The two tokenizer methods TokenText uses, for GPT-2 style byte-level pieces."""

    all_special_ids: ClassVar[list[int]] = [0]
    pieces: ClassVar[dict[int, str]] = {1: "\u0120caf", 2: "\u00c3", 3: "\u00a9", 4: "<0xE2>"}

    def decode(self, ids: list[int]) -> str:
        return {1: " caf", 2: "\ufffd", 3: "\ufffd", 4: "\ufffd"}[ids[0]]

    def convert_ids_to_tokens(self, token_id: int) -> str:
        return self.pieces[token_id]


def test_token_bytes_are_exact_for_pieces_of_a_character() -> None:
    tokens = TokenText(_ByteLevelTokenizer())
    assert tokens.raw(1, None) == b" caf"
    # "é" is two byte-level tokens: each gets its own byte, and together they spell the text.
    assert tokens.raw(2, None) + tokens.raw(3, None) == "\u00e9".encode()
    assert tokens.raw(4, None) == b"\xe2"  # SentencePiece's byte fallback
    assert tokens.is_special(0) and not tokens.is_special(1)
    assert len(byte_decoder()) == 256


# --- Parquet ---------------------------------------------------------------------------------


def _journal(tmp_path: Path, outcomes: list[Any]) -> Path:
    path = tmp_path / "journal.jsonl"
    with JournalWriter(path) as w:
        w.append([result_record(o, i + 1, 1) for i, o in enumerate(outcomes)])
    return path


def test_parquet_has_no_new_columns_when_no_answer_has_them(tmp_path: Path) -> None:
    request = Request("a", 1, CHAT, line(CHAT)["body"])
    outcome = success(request, [Choice("hi", "stop", 1)], model="m", prompt_tokens=1, latency_s=0)
    export_parquet(_journal(tmp_path, [outcome]), tmp_path)
    columns = pd.read_parquet(tmp_path / "results.parquet").columns
    assert "logprobs" not in columns and "embeddings" not in columns


def test_parquet_embeddings_of_several_sizes_are_lists(tmp_path: Path) -> None:
    outcomes = [
        embedding_success(
            Request(cid, i + 1, EMBEDDINGS, line(EMBEDDINGS)["body"]),
            [echo_vector(cid, size)],
            model="m",
            prompt_tokens=1,
            latency_s=0,
        )
        for i, (cid, size) in enumerate([("a", 8), ("b", 4)])
    ]
    export_parquet(_journal(tmp_path, outcomes), tmp_path)
    schema = pq.read_schema(tmp_path / "results.parquet")
    assert str(schema.field("embeddings").type) == "list<element: list<element: float>>"
    df = pd.read_parquet(tmp_path / "results.parquet")
    assert [len(e[0]) for e in df["embeddings"]] == [8, 4]


# --- the whole pipeline on the echo engine ---------------------------------------------------


def _run_echo(tmp_path: Path, sample: str) -> Path:
    job = tmp_path / "job"
    run = submit_echo(SAMPLES / sample, job)
    assert run.returncode == 1, run.stderr[-3000:]  # the samples hold refused lines on purpose
    assert "Traceback" not in run.stderr
    assert cli("export", "--job-dir", str(job)).returncode == 0
    assert cli("export", "--job-dir", str(job), "--parquet").returncode == 0
    return job


@pytest.mark.parametrize(
    ("sample", "url"),
    [
        ("chat_fidelity.jsonl", CHAT),
        ("completions_fidelity.jsonl", COMPLETIONS),
        ("embeddings.jsonl", EMBEDDINGS),
    ],
)
def test_every_sample_line_parses_with_the_openai_types_on_the_echo_engine(
    tmp_path: Path, sample: str, url: str
) -> None:
    job = _run_echo(tmp_path, sample)
    requests = requests_of(SAMPLES / sample)
    outputs = output_lines(job / "output.jsonl")
    assert outputs
    for cid, out in outputs.items():
        assert out["response"]["status_code"] == 200 and out["error"] is None
        check_against_request(url, requests[cid], parse_body(url, out["response"]["body"]))
    errors = output_lines(job / "errors.jsonl")
    assert set(errors) | set(outputs) == set(requests)
    for cid, err in errors.items():
        assert cid.startswith("refused") or cid in {"dimensions-native", "too-long"}, cid
        assert err["error"]["code"] == "invalid_request"
        assert err["response"] is None or err["response"]["status_code"] == 400


def test_echo_embeddings_flow_to_a_fixed_size_list_column(tmp_path: Path) -> None:
    job = _run_echo(tmp_path, "embeddings.jsonl")
    schema = pq.read_schema(job / "results.parquet")
    # The echo engine honours "dimensions-native"'s 384 too: two sizes, so a list of lists of
    # float32 (one size: tests/test_embedding_vectors.py).
    assert str(schema.field("embeddings").type) == "list<element: list<element: float>>"
    df = pd.read_parquet(job / "results.parquet").set_index("custom_id")
    assert len(df.loc["dimensions-native", "embeddings"][0]) == 384
    assert len(df.loc["string", "embeddings"][0]) == ECHO_DIMENSIONS
    assert df.loc["list-of-strings", "n_choices"] == 3
    assert len(df.loc["list-of-strings", "embeddings"]) == 3
    # base64 in output.jsonl, floats in Parquet: the same vector as the float line's.
    assert list(df.loc["base64", "embeddings"][0]) == list(df.loc["string", "embeddings"][0])
    assert df.loc["refused-empty", "status"] == "invalid"


def test_echo_logprobs_flow_to_a_nested_list_column(tmp_path: Path) -> None:
    job = _run_echo(tmp_path, "chat_fidelity.jsonl")
    df = pd.read_parquet(job / "results.parquet").set_index("custom_id")
    tokens = df.loc["logprobs-top-3", "logprobs"]
    assert [t["token"] for t in tokens] == ["Say", " hi."]
    assert list(tokens[0]["top_logprobs"]) == [{"token": "Say", "logprob": 0.0}]
    assert df.loc["plain", "logprobs"] is None


def test_the_echo_engine_keeps_the_stop_string_when_asked(tmp_path: Path) -> None:
    """include_stop_str_in_output, the one vLLM extension that acts on the echo engine's reply
    (the rest act on how a model samples)."""
    src = write_jsonl(
        tmp_path / "in.jsonl",
        [
            line(CHAT, cid, messages=[{"role": "user", "content": "abc def"}], stop=["c"], **extra)
            for cid, extra in [("cut", {}), ("kept", {"include_stop_str_in_output": True})]
        ],
    )
    job = tmp_path / "job"
    run = submit_echo(src, job)
    assert run.returncode == 0, run.stderr[-3000:]
    assert cli("export", "--job-dir", str(job)).returncode == 0
    outputs = output_lines(job / "output.jsonl")
    text = {
        cid: out["response"]["body"]["choices"][0]["message"]["content"]
        for cid, out in outputs.items()
    }
    assert text["cut"].endswith("ab") and text["kept"] == text["cut"] + "c", text
