"""Tests of batchrun.reader: streaming the input file and the per-line validation rules."""

from __future__ import annotations

import bz2
import gzip
import hashlib
import io
import json
import lzma
import os
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from batchrun.errors import BatchrunError
from batchrun.openai.reader import check_input_file, hash_file, is_probably_not_jsonl, read_input
from batchrun.openai.records import CHAT, COMPLETIONS, LineError, Request

ENDPOINTS = (
    "'/v1/chat/completions', '/v1/completions', '/v1/embeddings', '/v1/responses', '/v1/score', "
    "'/score', '/v1/rerank', '/rerank', '/v2/rerank', '/v1/audio/transcriptions', "
    "'/v1/audio/translations'"
)


def chat(custom_id: Any = "req-1", **body: Any) -> dict[str, Any]:
    """A valid chat line as a dict; keyword arguments replace or add body fields."""
    b: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "Hi"}]}
    b.update(body)
    return {"custom_id": custom_id, "method": "POST", "url": CHAT, "body": b}


def completion(custom_id: str = "req-1", **body: Any) -> dict[str, Any]:
    """A valid completions line as a dict."""
    b: dict[str, Any] = {"model": "m", "prompt": "Once upon a time"}
    b.update(body)
    return {"custom_id": custom_id, "method": "POST", "url": COMPLETIONS, "body": b}


def write(tmp_path: Path, *lines: dict[str, Any] | str | bytes, name: str = "in.jsonl") -> Path:
    """Write the lines (dicts become JSON) joined by newlines, with a trailing newline."""
    parts: list[bytes] = []
    for item in lines:
        if isinstance(item, dict):
            parts.append(json.dumps(item).encode())
        elif isinstance(item, str):
            parts.append(item.encode())
        else:
            parts.append(item)
    path = tmp_path / name
    path.write_bytes(b"\n".join(parts) + b"\n")
    return path


def read(path: Path) -> list[Request | LineError]:
    return list(read_input(path))


def only_error(path: Path) -> LineError:
    """The single record read from `path`, which must be a LineError."""
    out = read(path)
    assert len(out) == 1
    assert isinstance(out[0], LineError), out[0]
    return out[0]


# --- valid lines -----------------------------------------------------------------------------


def test_valid_chat_line_becomes_request(tmp_path: Path) -> None:
    line = chat("a", max_tokens=16, temperature=0.5, extra_field={"x": 1})
    assert read(write(tmp_path, line)) == [Request("a", 1, CHAT, line["body"])]


def test_valid_completions_lines_string_and_list_of_one(tmp_path: Path) -> None:
    a = completion("a")
    b = completion("b", prompt=["one prompt"])
    assert read(write(tmp_path, a, b)) == [
        Request("a", 1, COMPLETIONS, a["body"]),
        Request("b", 2, COMPLETIONS, b["body"]),
    ]


def test_unknown_top_level_and_body_fields_are_allowed(tmp_path: Path) -> None:
    line = chat("a", logprobs=True, response_format={"type": "json_object"})
    line["metadata"] = {"owner": "me"}
    out = read(write(tmp_path, line))
    assert out == [Request("a", 1, CHAT, line["body"])]


def test_null_optional_fields_mean_not_set(tmp_path: Path) -> None:
    line = chat("a", temperature=None, max_tokens=None, stop=None, stream=None)
    assert read(write(tmp_path, line)) == [Request("a", 1, CHAT, line["body"])]


def test_mixed_file_yields_valid_lines_in_order(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        chat("a"),
        "not json",
        chat("b"),
        chat("a"),
        chat("c", temperature=5),
        chat("d"),
    )
    out = read(path)
    assert [(type(r).__name__, r.line, r.custom_id) for r in out] == [
        ("Request", 1, "a"),
        ("LineError", 2, None),
        ("Request", 3, "b"),
        ("LineError", 4, "a"),
        ("LineError", 5, "c"),
        ("Request", 6, "d"),
    ]
    codes = [r.code for r in out if isinstance(r, LineError)]
    assert codes == ["invalid_json", "duplicate_custom_id", "invalid_request"]


# --- framing: blank lines, BOM, CRLF, encoding, sizes ----------------------------------------


def test_blank_lines_are_skipped_and_keep_line_numbers(tmp_path: Path) -> None:
    path = write(tmp_path, "", chat("a"), "   ", "\t", chat("b"), "", "not json", "")
    out = read(path)
    assert [(r.line, r.custom_id) for r in out] == [(2, "a"), (5, "b"), (7, None)]
    assert isinstance(out[2], LineError)


def test_bom_and_crlf(tmp_path: Path) -> None:
    path = tmp_path / "bom.jsonl"
    a, b = chat("a"), chat("b")
    path.write_bytes(
        b"\xef\xbb\xbf" + json.dumps(a).encode() + b"\r\n\r\n" + json.dumps(b).encode() + b"\r\n"
    )
    assert read(path) == [Request("a", 1, CHAT, a["body"]), Request("b", 3, CHAT, b["body"])]


def test_last_line_without_newline(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    path.write_bytes(json.dumps(chat("a")).encode() + b"\n" + json.dumps(chat("b")).encode())
    assert [r.custom_id for r in read(path)] == ["a", "b"]


def test_leading_whitespace_before_object_is_fine(tmp_path: Path) -> None:
    line = chat("a")
    assert read(write(tmp_path, "   " + json.dumps(line))) == [Request("a", 1, CHAT, line["body"])]


def test_non_utf8_line(tmp_path: Path) -> None:
    bad = b'{"custom_id": "caf\xe9", "method": "POST"}'
    path = write(tmp_path, chat("a"), bad, chat("b"))
    out = read(path)
    assert out[1] == LineError(
        2,
        None,
        "invalid_json",
        "line is not valid UTF-8 (byte 0xe9 at byte 19 of the line); save the file as UTF-8",
    )
    assert [r.custom_id for r in out] == ["a", None, "b"]


def test_utf8_encoded_surrogate_is_not_valid_utf8(tmp_path: Path) -> None:
    # json.loads(bytes) would accept this (it decodes with surrogatepass); strict UTF-8 does not.
    bad = b'{"custom_id": "\xed\xa0\x80"}'
    err = only_error(write(tmp_path, bad))
    assert (err.line, err.code) == (1, "invalid_json")
    assert "not valid UTF-8" in err.message


def test_non_ascii_utf8_is_fine(tmp_path: Path) -> None:
    line = chat("café-☕", messages=[{"role": "user", "content": "Grüß dich 👋"}])
    assert read(write(tmp_path, line)) == [Request("café-☕", 1, CHAT, line["body"])]


def test_five_megabyte_line(tmp_path: Path) -> None:
    big = "x" * (5 * 1024 * 1024)
    line = chat("big", messages=[{"role": "user", "content": big}])
    path = write(tmp_path, chat("a"), line, chat("b"))
    out = read(path)
    assert [r.custom_id for r in out] == ["a", "big", "b"]
    assert isinstance(out[1], Request)
    assert out[1].line == 2
    assert out[1].body["messages"][0]["content"] == big


# --- JSON-level errors -----------------------------------------------------------------------


def test_not_json_names_reason_and_column(tmp_path: Path) -> None:
    err = only_error(write(tmp_path, '{"custom_id": "a" "method": "POST"}'))
    assert err == LineError(
        1, None, "invalid_json", "line is not valid JSON: Expecting ',' delimiter at column 19"
    )


def test_cut_off_line_says_so(tmp_path: Path) -> None:
    err = only_error(write(tmp_path, '{"custom_id": "a", "method": "POST"'))
    assert err == LineError(
        1,
        None,
        "invalid_json",
        "line is not valid JSON: Expecting ',' delimiter at the end of the line (is it cut off?)",
    )


def test_extra_data_after_object(tmp_path: Path) -> None:
    err = only_error(write(tmp_path, json.dumps(chat("a")) + " {}"))
    assert err.code == "invalid_json"
    assert err.message.startswith("line is not valid JSON: Extra data at column ")


def test_two_objects_on_one_line_is_invalid(tmp_path: Path) -> None:
    err = only_error(write(tmp_path, json.dumps(chat("a")) + json.dumps(chat("b"))))
    assert (err.line, err.custom_id, err.code) == (1, None, "invalid_json")


def test_nan_is_not_json_but_its_error_names_the_request(tmp_path: Path) -> None:
    err = only_error(write(tmp_path, json.dumps(chat("a", temperature=float("nan")))))
    assert err == LineError(
        1, "a", "invalid_json", "line is not valid JSON: NaN is not a valid JSON number"
    )
    line = json.dumps({**chat("b"), "custom_id": 7, "x": float("-inf")})
    err = only_error(write(tmp_path, line))  # a custom_id that is not a string is not named
    assert err == LineError(
        1, None, "invalid_json", "line is not valid JSON: -Infinity is not a valid JSON number"
    )


def test_deeply_nested_json_is_caught(tmp_path: Path) -> None:
    deep = '{"custom_id": "a", "x": ' + "[" * 200_000 + "]" * 200_000 + "}"
    path = write(tmp_path, deep, chat("b"))
    out = read(path)
    assert out[0] == LineError(
        1, None, "invalid_json", "line is not valid JSON: it is nested too deeply to read"
    )
    assert [r.custom_id for r in out] == [None, "b"]


def test_huge_integer_literal_is_caught(tmp_path: Path) -> None:
    err = only_error(write(tmp_path, '{"custom_id": "a", "seed": ' + "9" * 5000 + "}"))
    assert (err.line, err.code) == (1, "invalid_json")
    assert err.message.startswith("line is not valid JSON: ")
    assert len(err.message) < 200


def test_json_array_line(tmp_path: Path) -> None:
    out = read(write(tmp_path, chat("a"), "[1, 2]"))
    assert out[1] == LineError(
        2,
        None,
        "invalid_request",
        'line is a JSON array, expected an object {"custom_id", "method", "url", "body"}',
    )


@pytest.mark.parametrize(
    ("text", "kind"),
    [('"hello"', "string"), ("42", "number"), ("null", "null"), ("true", "boolean")],
)
def test_json_scalar_line(tmp_path: Path, text: str, kind: str) -> None:
    err = only_error(write(tmp_path, text))
    assert err == LineError(
        1,
        None,
        "invalid_request",
        f'line is a JSON {kind}, expected an object {{"custom_id", "method", "url", "body"}}',
    )


# --- custom_id -------------------------------------------------------------------------------


def test_missing_custom_id(tmp_path: Path) -> None:
    line = chat()
    del line["custom_id"]
    err = only_error(write(tmp_path, line))
    assert err == LineError(
        1, None, "missing_custom_id", "custom_id is missing; every line needs one"
    )


def test_custom_id_not_a_string(tmp_path: Path) -> None:
    err = only_error(write(tmp_path, chat(123)))
    assert err == LineError(
        1, None, "invalid_custom_id", "custom_id must be a string, got a number 123"
    )


def test_custom_id_null(tmp_path: Path) -> None:
    err = only_error(write(tmp_path, chat(None)))
    assert err == LineError(1, None, "invalid_custom_id", "custom_id must be a string, got null")


def test_empty_custom_id(tmp_path: Path) -> None:
    err = only_error(write(tmp_path, chat("")))
    assert err == LineError(1, None, "invalid_custom_id", "custom_id must not be empty")


def test_custom_id_length_limit(tmp_path: Path) -> None:
    ok, too_long = "a" * 512, "b" * 513
    out = read(write(tmp_path, chat(ok), chat(too_long)))
    assert isinstance(out[0], Request)
    assert out[0].custom_id == ok
    assert isinstance(out[1], LineError)
    assert (out[1].line, out[1].custom_id, out[1].code) == (2, None, "invalid_custom_id")
    assert out[1].message.startswith("custom_id is 513 characters long, the limit is 512: 'bbb")
    assert len(out[1].message) < 200


def test_duplicate_custom_id_keeps_the_first(tmp_path: Path) -> None:
    first = chat("dup", temperature=0.1)
    path = write(tmp_path, first, chat("other"), chat("dup"), "", chat("dup"))
    out = read(path)
    assert out[0] == Request("dup", 1, CHAT, first["body"])
    assert out[2] == LineError(
        3,
        "dup",
        "duplicate_custom_id",
        "custom_id 'dup' already appeared on line 1; custom_id must be unique within the file",
    )
    assert isinstance(out[3], LineError)
    assert (out[3].line, out[3].code) == (5, "duplicate_custom_id")
    assert "line 1;" in out[3].message


def test_custom_id_of_a_bad_line_still_counts_for_duplicates(tmp_path: Path) -> None:
    out = read(write(tmp_path, chat("a", temperature=9), chat("a")))
    assert isinstance(out[1], LineError)
    assert (out[1].line, out[1].custom_id, out[1].code) == (2, "a", "duplicate_custom_id")


# --- method and url --------------------------------------------------------------------------


def test_method_must_be_post(tmp_path: Path) -> None:
    line = chat("a")
    line["method"] = "GET"
    err = only_error(write(tmp_path, line))
    assert err == LineError(1, "a", "invalid_method", "method must be \"POST\", got 'GET'")


def test_method_missing(tmp_path: Path) -> None:
    line = chat("a")
    del line["method"]
    err = only_error(write(tmp_path, line))
    assert err == LineError(1, "a", "invalid_method", 'method is missing; expected "POST"')


def test_unsupported_url(tmp_path: Path) -> None:
    line = chat("a")
    line["url"] = "/v1/chat"
    err = only_error(write(tmp_path, line))
    assert err == LineError(
        1, "a", "invalid_url", f"url must be one of {ENDPOINTS}, got '/v1/chat'"
    )


def test_url_missing(tmp_path: Path) -> None:
    line = chat("a")
    del line["url"]
    err = only_error(write(tmp_path, line))
    assert err == LineError(1, "a", "invalid_url", f"url is missing; expected one of {ENDPOINTS}")


def test_mixed_urls_names_the_files_url_and_line(tmp_path: Path) -> None:
    bad_url = chat("x")
    bad_url["url"] = "/v1/nope"
    # Line 1 is blank and line 2 has a bad url: line 3 is the first to fix the file's url.
    path = write(tmp_path, "", bad_url, completion("a"), chat("b"), completion("c"))
    out = read(path)
    assert [r.line for r in out] == [2, 3, 4, 5]
    assert out[2] == LineError(
        4,
        "b",
        "mixed_urls",
        "url '/v1/chat/completions' differs from this file's url '/v1/completions' (set by "
        "line 3); every line of a batch must use the same url",
    )
    assert isinstance(out[3], Request)


# --- body ------------------------------------------------------------------------------------


def test_body_must_be_an_object(tmp_path: Path) -> None:
    line = chat("a")
    line["body"] = "hello"
    err = only_error(write(tmp_path, line))
    assert err == LineError(
        1, "a", "invalid_body", "body must be a JSON object, got a string 'hello'"
    )


def test_body_missing(tmp_path: Path) -> None:
    line = chat("a")
    del line["body"]
    err = only_error(write(tmp_path, line))
    assert err == LineError(1, "a", "invalid_body", "body is missing; expected a JSON object")


@pytest.mark.parametrize(
    ("messages", "message"),
    [
        ("MISSING", "body.messages is missing; a chat request needs a list of messages"),
        ("hi", "body.messages must be an array of messages, got a string"),
        ([], "body.messages must not be empty"),
        (
            [{"role": "user", "content": "a"}, "b"],
            "body.messages[1] must be an object with role and content, got a string",
        ),
        (
            [
                {"role": "system", "content": "a"},
                {"role": "user", "content": "b"},
                {"role": "wizard", "content": "c"},
            ],
            "body.messages[2].role must be one of system, developer, user, assistant, tool; "
            "got 'wizard'",
        ),
        (
            [{"content": "c"}],
            "body.messages[0].role must be one of system, developer, user, assistant, tool; "
            "it is missing",
        ),
        (
            [{"role": ["user"], "content": "c"}],
            "body.messages[0].role must be one of system, developer, user, assistant, tool; "
            "got an array of 1 item",
        ),
        (
            [{"role": "user"}],
            "body.messages[0].content must be a string or an array of content parts; it is missing",
        ),
        (
            [{"role": "user", "content": None}],
            "body.messages[0].content must be a string or an array of content parts; got null",
        ),
        (
            [{"role": "user", "content": 5}],
            "body.messages[0].content must be a string or an array of content parts, "
            "got a number 5",
        ),
        ([{"role": "user", "content": []}], "body.messages[0].content must not be an empty array"),
        (
            [{"role": "user", "content": [{"text": "x"}]}],
            "body.messages[0].content[0].type must be a string such as 'text'; it is missing",
        ),
        (
            [{"role": "user", "content": ["x"]}],
            "body.messages[0].content[0] must be an object with a type, got a string 'x'",
        ),
        (
            [{"role": "user", "content": [{"type": "text", "text": 3}]}],
            "body.messages[0].content[0].text must be a string for a part of type 'text'",
        ),
    ],
)
def test_chat_messages_rules(tmp_path: Path, messages: Any, message: str) -> None:
    line = chat("a")
    if messages == "MISSING":
        del line["body"]["messages"]
    else:
        line["body"]["messages"] = messages
    err = only_error(write(tmp_path, line))
    assert err == LineError(1, "a", "invalid_request", message)


def test_chat_content_parts_and_tool_calls_are_valid(tmp_path: Path) -> None:
    messages = [
        {"role": "developer", "content": "be brief"},
        {
            "role": "user",
            "content": [{"type": "text", "text": "hi"}, {"type": "text", "text": "!"}],
        },
        {"role": "assistant", "content": None, "tool_calls": [{"id": "t1"}]},
        {"role": "tool", "content": "42", "tool_call_id": "t1"},
    ]
    line = chat("a", messages=messages)
    assert read(write(tmp_path, line)) == [Request("a", 1, CHAT, line["body"])]


@pytest.mark.parametrize(
    ("part", "code", "message"),
    [
        (
            {"type": "image_url", "image_url": {"url": "x"}},
            "invalid_media",
            "body.messages[0].content[1].image_url.url must be a data: URL (base64), an "
            "http(s):// URL or a file:// URL, got 'x'",
        ),
        (
            {"type": "input_audio"},
            "invalid_request",
            'body.messages[0].content[1].input_audio must be an object {"data", "format"}, '
            "got null",
        ),
        (
            {"type": "input_file", "file": {}},
            "invalid_request",
            "body.messages[0].content[1].type 'input_file' is not supported: a part is of type "
            "'text', 'image_url', 'input_audio', 'audio_url' or 'video_url'",
        ),
    ],
)
def test_chat_media_parts_are_checked_at_validation(
    tmp_path: Path, part: dict[str, object], code: str, message: str
) -> None:
    """Media parts are taken (a multimodal model reads them); a broken one is refused at once."""
    content = [{"type": "text", "text": "what is this?"}, part]
    err = only_error(write(tmp_path, chat("a", messages=[{"role": "user", "content": content}])))
    assert err == LineError(1, "a", code, message)


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ("MISSING", "body.prompt is missing; a completions request needs a prompt string"),
        ("", "body.prompt must not be empty"),
        ([""], "body.prompt[0] must not be empty"),
        (5, "body.prompt must be a string, got a number 5"),
        (
            [1, 2, 3],
            "body.prompt must be a string or an array of exactly one string, got an "
            "array of 3 items (batchrun runs one prompt per request)",
        ),
        ([7], "body.prompt[0] must be a string, got a number 7"),
        (
            [],
            "body.prompt must be a string or an array of exactly one string, got an "
            "array of 0 items (batchrun runs one prompt per request)",
        ),
    ],
)
def test_completions_prompt_rules(tmp_path: Path, prompt: Any, message: str) -> None:
    line = completion("a")
    if prompt == "MISSING":
        del line["body"]["prompt"]
    else:
        line["body"]["prompt"] = prompt
    err = only_error(write(tmp_path, line))
    assert err == LineError(1, "a", "invalid_request", message)


def test_model_must_be_a_string(tmp_path: Path) -> None:
    err = only_error(write(tmp_path, chat("a", model=3)))
    assert err == LineError(
        1, "a", "invalid_request", "body.model must be a string, got a number 3"
    )


# --- sampling fields -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("max_tokens", 0, "body.max_tokens must be between 1 and 1000000, got 0"),
        ("max_tokens", 1_000_001, "body.max_tokens must be between 1 and 1000000, got 1000001"),
        ("max_tokens", 1.5, "body.max_tokens must be a whole number, got a number 1.5"),
        ("max_tokens", True, "body.max_tokens must be a whole number, got a boolean true"),
        ("max_tokens", "16", "body.max_tokens must be a whole number, got a string '16'"),
        (
            "max_completion_tokens",
            -1,
            "body.max_completion_tokens must be between 1 and 1000000, got -1",
        ),
        ("temperature", 2.5, "body.temperature must be at least 0 and at most 2, got 2.5"),
        ("temperature", -0.1, "body.temperature must be at least 0 and at most 2, got -0.1"),
        ("temperature", False, "body.temperature must be a number, got a boolean false"),
        ("temperature", "hot", "body.temperature must be a number, got a string 'hot'"),
        ("top_p", 0, "body.top_p must be greater than 0 and at most 1, got 0"),
        ("top_p", 1.01, "body.top_p must be greater than 0 and at most 1, got 1.01"),
        ("n", 0, "body.n must be between 1 and 128, got 0"),
        ("n", 129, "body.n must be between 1 and 128, got 129"),
        ("n", True, "body.n must be a whole number, got a boolean true"),
        ("seed", "7", "body.seed must be a whole number, got a string '7'"),
        ("seed", True, "body.seed must be a whole number, got a boolean true"),
        ("seed", 1.0, "body.seed must be a whole number, got a number 1.0"),
        ("stop", 5, "body.stop must be a string or an array of up to 4 strings, got a number 5"),
        ("stop", ["a", "b", "c", "d", "e"], "body.stop may hold at most 4 strings, got 5"),
        ("stop", ["a", 1], "body.stop[1] must be a string, got a number 1"),
        (
            "presence_penalty",
            2.5,
            "body.presence_penalty must be at least -2 and at most 2, got 2.5",
        ),
        (
            "frequency_penalty",
            -3,
            "body.frequency_penalty must be at least -2 and at most 2, got -3",
        ),
        ("frequency_penalty", True, "body.frequency_penalty must be a number, got a boolean true"),
        (
            "stream",
            True,
            "stream is not supported in a batch; remove body.stream or set it to false",
        ),
        ("stream", "yes", "body.stream must be true or false, got 'yes'"),
    ],
)
def test_sampling_field_rules(tmp_path: Path, field: str, value: Any, message: str) -> None:
    err = only_error(write(tmp_path, chat("a", **{field: value})))
    assert err == LineError(1, "a", "invalid_request", message)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_tokens", 1),
        ("max_tokens", 1_000_000),
        ("max_completion_tokens", 64),
        ("temperature", 0),
        ("temperature", 2),
        ("temperature", 0.7),
        ("top_p", 1),
        ("top_p", 0.01),
        ("n", 1),
        ("n", 128),
        ("seed", -5),
        ("stop", "\n"),
        ("stop", ["a", "b", "c", "d"]),
        ("stop", []),
        ("presence_penalty", -2),
        ("frequency_penalty", 2.0),
        ("stream", False),
    ],
)
def test_sampling_field_valid_values(tmp_path: Path, field: str, value: Any) -> None:
    line = chat("a", **{field: value})
    assert read(write(tmp_path, line)) == [Request("a", 1, CHAT, line["body"])]


def test_sampling_rules_apply_to_completions_too(tmp_path: Path) -> None:
    err = only_error(write(tmp_path, completion("a", top_p=0)))
    assert err == LineError(
        1, "a", "invalid_request", "body.top_p must be greater than 0 and at most 1, got 0"
    )


def test_echoed_values_are_truncated(tmp_path: Path) -> None:
    huge = "w" * 100_000
    err = only_error(write(tmp_path, chat("a", messages=[{"role": huge, "content": "x"}])))
    assert err.code == "invalid_request"
    assert err.message.startswith("body.messages[0].role must be one of system, developer,")
    assert "'" + "w" * 80 + "'... (100000 characters)" in err.message
    assert len(err.message) < 250


# --- hash_file -------------------------------------------------------------------------------


def test_hash_file_matches_sha256(tmp_path: Path) -> None:
    data = os.urandom(3 * 1024 * 1024 + 17)  # spans several 1 MiB blocks
    path = tmp_path / "data.bin"
    path.write_bytes(data)
    assert hash_file(path) == hashlib.sha256(data).hexdigest()


def test_hash_file_empty(tmp_path: Path) -> None:
    path = tmp_path / "empty"
    path.write_bytes(b"")
    assert hash_file(path) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


# --- check_input_file ------------------------------------------------------------------------


def test_check_input_file_accepts_a_jsonl_file(tmp_path: Path) -> None:
    check_input_file(write(tmp_path, chat("a")))


def test_check_input_file_missing(tmp_path: Path) -> None:
    path = tmp_path / "nope.jsonl"
    with pytest.raises(BatchrunError) as e:
        check_input_file(path)
    assert str(e.value) == f"input file not found: {path}"


def test_check_input_file_directory(tmp_path: Path) -> None:
    with pytest.raises(BatchrunError) as e:
        check_input_file(tmp_path)
    assert str(e.value) == f"input path is a directory, not a file: {tmp_path}"


@pytest.mark.parametrize("content", [b"", b"  \n\r\n\t\n", b"\xef\xbb\xbf\n\n"])
def test_check_input_file_empty(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_bytes(content)
    with pytest.raises(BatchrunError) as e:
        check_input_file(path)
    assert str(e.value) == f"input file is empty: {path}"


def test_check_input_file_content_after_a_megabyte_of_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "late.jsonl"
    path.write_bytes(b"\n" * (2 * 1024 * 1024) + json.dumps(chat("a")).encode())
    check_input_file(path)


def test_check_input_file_unreadable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, chat("a"))
    if os.geteuid() != 0:
        path.chmod(0)
    else:
        # root reads any file whatever its mode: make the open itself fail as it would.
        def deny(self: Path, *args: Any, **kwargs: Any) -> Any:
            raise PermissionError(13, "Permission denied", str(self))

        monkeypatch.setattr(Path, "open", deny)
    with pytest.raises(BatchrunError) as e:
        check_input_file(path)
    assert str(e.value) == f"cannot read input file (permission denied): {path}"


def test_check_input_file_fifo(tmp_path: Path) -> None:
    path = tmp_path / "pipe"
    os.mkfifo(path)
    with pytest.raises(BatchrunError) as e:
        check_input_file(path)
    assert str(e.value) == f"input must be a regular file (not a pipe or device): {path}"


# --- is_probably_not_jsonl -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("head", "expected"),
    [
        (b'{"custom_id": "a"}\n', False),
        (b'\xef\xbb\xbf  \n{"custom_id": "a"}', False),
        (b"", False),
        (b"\x89PNG\r\n\x1a\n\x00\x00", True),
        (b"\x1f\x8b\x08\x00", True),
        (b"custom_id,prompt\na,hello\n", True),
        (b'[{"custom_id": "a"}]', True),
        (b'{"a": "\x00"}', True),
    ],
)
def test_is_probably_not_jsonl(head: bytes, expected: bool) -> None:
    assert is_probably_not_jsonl(head) is expected


def test_binary_file_reads_as_errors_only(tmp_path: Path) -> None:
    path = tmp_path / "blob.bin"
    path.write_bytes(bytes(range(256)) * 4)
    out = read(path)
    assert out
    assert all(isinstance(r, LineError) and r.code == "invalid_json" for r in out)


def test_check_input_file_under_a_file_is_not_found(tmp_path: Path) -> None:
    parent = write(tmp_path, chat("a"))
    path = parent / "x.jsonl"
    with pytest.raises(BatchrunError) as e:
        check_input_file(path)
    assert str(e.value) == f"input file not found: {path}"


def test_check_input_file_stat_denied(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "locked" / "in.jsonl"

    def deny(self: Path, *args: Any, **kwargs: Any) -> Any:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "stat", deny)
    with pytest.raises(BatchrunError) as e:
        check_input_file(path)
    assert str(e.value) == f"cannot read input file (permission denied): {path}"


def test_nested_array_is_described_once(tmp_path: Path) -> None:
    err = only_error(write(tmp_path, completion("a", prompt=[["x"]])))
    assert err == LineError(
        1, "a", "invalid_request", "body.prompt[0] must be a string, got an array of 1 item"
    )


def test_a_bom_inside_the_file_and_nul_bytes_are_named_as_such(tmp_path: Path) -> None:
    """`cat a.jsonl b.jsonl` leaves b's BOM at the start of a line; UTF-16 text holds NULs."""
    bom = b"\xef\xbb\xbf" + json.dumps(chat("b1")).encode()
    utf16 = json.dumps(chat("u1")).encode("utf-16-le")
    items = read(write(tmp_path, chat("a1"), bom, utf16))
    assert isinstance(items[0], Request)
    errors = [x for x in items if isinstance(x, LineError)]
    assert [(e.line, e.code) for e in errors] == [(2, "invalid_json"), (3, "invalid_json")]
    assert "byte order mark (BOM)" in errors[0].message
    assert "UTF-16" in errors[1].message


def test_a_line_cut_off_inside_a_string_says_so(tmp_path: Path) -> None:
    line = json.dumps(chat("cut", messages=[{"role": "user", "content": "never finished"}]))
    cut = line[: line.index("never") + 5]
    err = only_error(write(tmp_path, cut))
    col = cut.index('"never') + 1
    assert err.message == (
        f"line is not valid JSON: the string that starts at column {col} never ends "
        "(is the line cut off?)"
    )


# --- compressed input ------------------------------------------------------------------------


def _zipped(data: bytes) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        z.writestr("in.jsonl", data)
    return buffer.getvalue()


# zstd's frame magic, then bytes enough: the check reads only the start.
_ZSTD = b"\x28\xb5\x2f\xfd\x24\x00\x01\x00\x00"


@pytest.mark.parametrize(
    ("name", "pack", "what", "command"),
    [
        ("in.jsonl.gz", gzip.compress, "gzip-compressed", "gunzip -k"),
        ("in.jsonl.zst", lambda data: _ZSTD + data, "zstd-compressed", "zstd -d"),
        ("in.jsonl.bz2", bz2.compress, "bzip2-compressed", "bunzip2 -k"),
        ("in.jsonl.xz", lzma.compress, "xz-compressed", "unxz -k"),
        ("in.zip", _zipped, "a zip archive", "unzip"),
    ],
)
def test_a_compressed_input_is_named_with_the_command_that_undoes_it(
    tmp_path: Path, name: str, pack: Callable[[bytes], bytes], what: str, command: str
) -> None:
    path = tmp_path / name
    path.write_bytes(pack(json.dumps(chat("a")).encode() + b"\n"))
    with pytest.raises(BatchrunError) as e:
        check_input_file(path)
    assert str(e.value) == f"input file {path} is {what}; decompress it first ({command} {path})"
    # Read anyway, its first line says the same instead of asking about UTF-16.
    first = read(path)[0]
    assert isinstance(first, LineError) and first.code == "invalid_json"
    assert "compressed data (is the file compressed? decompress it first)" in first.message
    assert "UTF-16" not in first.message


def test_the_decompress_command_quotes_the_path(tmp_path: Path) -> None:
    path = tmp_path / "my input.jsonl.gz"
    path.write_bytes(gzip.compress(b"{}\n"))
    with pytest.raises(BatchrunError) as e:
        check_input_file(path)
    assert str(e.value).endswith(f"(gunzip -k '{path}')")


@pytest.mark.parametrize("text", [b"BZh", b"BZhello\n", b"PK is not a zip\n"])
def test_text_that_only_starts_like_a_magic_number_is_read_as_text(
    tmp_path: Path, text: bytes
) -> None:
    path = tmp_path / "in.jsonl"
    path.write_bytes(text)
    check_input_file(path)  # not JSONL, but not compressed either: the reader says why per line
