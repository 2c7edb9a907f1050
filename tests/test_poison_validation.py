"""Requests that would crash the engine are refused at validation: lone surrogates, huge seeds.

A lone surrogate (a JSON \\ud83d escape with no pair: an emoji cut in half) is not Unicode text;
vLLM's tokenizer raises on it and UTF-8 writers refuse it. A seed beyond a signed 64-bit integer
passes vLLM's SamplingParams and then kills the engine in torch. Both must be an invalid-line error
record naming the field, while every other line runs.
"""

from __future__ import annotations

import gzip
import itertools
import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from support.cli import cli
from support.jobs import journal_records, submit_echo
from support.lines import chat_line, read_jsonl, write_jsonl

from batchrun.engines.echo import echo_text
from batchrun.openai.fields import SEED_MAX, SEED_MIN
from batchrun.openai.invalid import InvalidLine
from batchrun.openai.reader import read_input
from batchrun.openai.records import CHAT, COMPLETIONS, EMBEDDINGS, LineError, Request
from batchrun.openai.text import find_lone_surrogate, may_hold_lone_surrogate
from batchrun.openai.validation import check_body, check_custom_id

# What every lone-surrogate message ends with, after "<field> contains a lone surrogate (\\uXXXX)".
WHY = (
    "; it is not valid Unicode text (a \\uD800-\\uDFFF escape must be half of a pair: was the "
    "text cut in the middle of an emoji?)"
)
# The brief's line, as it sits in a file: \ud83d is a JSON escape, the file itself is valid UTF-8.
SURROGATE_LINE = (
    rb'{"custom_id":"sur","method":"POST","url":"/v1/chat/completions","body":{"messages":'
    rb'[{"role":"user","content":"truncated emoji \ud83d end"}],"max_tokens":4}}'
)
SEED_RANGE = "between -9223372036854775808 and 9223372036854775807 (a signed 64-bit integer)"


def line(cid: str, url: str = CHAT, **body: Any) -> bytes:
    """A request line's bytes; body fields holding the text BAD get a lone \\ud83d there."""
    if url == CHAT:
        body.setdefault("messages", [{"role": "user", "content": "hi"}])
    elif url == COMPLETIONS:
        body.setdefault("prompt", "hi")
    else:
        body.setdefault("input", "hi")
    obj = {"custom_id": cid, "method": "POST", "url": url, "body": body}
    # json.dumps cannot write a lone surrogate as UTF-8 text: put its escape in by hand.
    return json.dumps(obj).replace("BAD", "\\ud83d").encode()


def read_lines(tmp_path: Path, *lines: bytes) -> list[Request | LineError]:
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    return list(read_input(path))


# --- lone surrogates -------------------------------------------------------------------------


def test_the_lone_surrogate_line_is_refused_naming_the_field(tmp_path: Path) -> None:
    good = line("ok")
    items = read_lines(tmp_path, good, SURROGATE_LINE, good.replace(b'"ok"', b'"ok2"'))
    assert isinstance(items[0], Request) and isinstance(items[2], Request)
    assert items[1] == LineError(
        2,
        "sur",
        "invalid_request",
        "body.messages[0].content contains a lone surrogate (\\ud83d) at character 17" + WHY,
    )


@pytest.mark.parametrize(
    ("url", "body", "field"),
    [
        (
            CHAT,
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "x BAD"}]}]},
            "body.messages[0].content[0].text",
        ),
        (
            CHAT,
            {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u",
                                                               "name": "BAD"}]},
            "body.messages[1].name",
        ),
        (
            CHAT,
            {
                "messages": [
                    {"role": "user", "content": "u"},
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {"id": "c1", "type": "function",
                             "function": {"name": "f", "arguments": '{"q": "BAD"}'}}
                        ],
                    },
                ]
            },
            "body.messages[1].tool_calls[0].function.arguments",
        ),
        (
            CHAT,
            {"tools": [{"type": "function",
                        "function": {"name": "f", "description": "looks up BAD"}}]},
            "body.tools[0].function.description",
        ),
        (CHAT, {"stop": ["ok", "BAD"]}, "body.stop[1]"),
        (CHAT, {"model": "mBAD"}, "body.model"),
        (CHAT, {"user": "BAD"}, "body.user"),
        (
            CHAT,
            {"response_format": {"type": "json_schema", "json_schema": {
                "name": "n", "schema": {"type": "object", "properties": {
                    "first name": {"type": "string", "description": "BAD"}}}}}},
            'body.response_format.json_schema.schema.properties["first name"].description',
        ),
        (CHAT, {"some_future_field": {"deep": [["BAD"]]}}, "body.some_future_field.deep[0][0]"),
        (COMPLETIONS, {"prompt": "once BAD"}, "body.prompt"),
        (COMPLETIONS, {"prompt": ["BAD"]}, "body.prompt[0]"),
        (COMPLETIONS, {"stop": "BAD"}, "body.stop"),
        (EMBEDDINGS, {"input": "BAD"}, "body.input"),
        (EMBEDDINGS, {"input": ["fine", "BAD"]}, "body.input[1]"),
    ],
)  # fmt: skip
def test_a_lone_surrogate_anywhere_in_the_body_is_refused(
    tmp_path: Path, url: str, body: dict[str, Any], field: str
) -> None:
    (item,) = read_lines(tmp_path, line("x", url, **body))
    assert isinstance(item, LineError), item
    assert (item.line, item.custom_id, item.code) == (1, "x", "invalid_request")
    assert item.message.startswith(f"{field} contains a lone surrogate (\\ud83d) at character ")
    assert item.message.endswith(WHY)


def test_a_lone_surrogate_in_a_key_is_refused(tmp_path: Path) -> None:
    (item,) = read_lines(tmp_path, line("x", metadata={"kBAD": "v"}))
    assert isinstance(item, LineError)
    assert item.message == (
        'the key "k\\ud83d" of body.metadata contains a lone surrogate (\\ud83d) at character 2'
        + WHY
    )


def test_a_lone_surrogate_in_the_custom_id_is_refused_without_writing_the_id(
    tmp_path: Path,
) -> None:
    items = read_lines(tmp_path, line("idBAD"), line("fine"))
    assert items[0] == LineError(
        1,
        None,
        "invalid_custom_id",
        "custom_id 'id\\ud83d' contains a lone surrogate (\\ud83d) at character 3" + WHY,
    )
    assert isinstance(items[1], Request)


@pytest.mark.parametrize(
    ("escaped", "text"),
    [
        (rb"\ud83d\ude00", "\U0001f600"),  # a pair: one emoji
        (rb"\uD83D\uDE00", "\U0001f600"),  # upper case
        (rb"\udbff\udfff", "\U0010ffff"),  # the last pair
        (rb"\\ud83d", "\\ud83d"),  # an escaped backslash: the text "\ud83d", no surrogate
        (rb"caf\u00e9", "caf\u00e9"),  # an escape outside the surrogates
    ],
)
def test_well_formed_text_written_with_escapes_is_accepted(
    tmp_path: Path, escaped: bytes, text: str
) -> None:
    (item,) = read_lines(tmp_path, line("x", messages=[{"role": "user", "content": "T"}])
                         .replace(b'"T"', b'"' + escaped + b'"'))  # fmt: skip
    assert isinstance(item, Request), item
    assert item.body["messages"][0]["content"] == text


@pytest.mark.parametrize(
    ("escaped", "code_point"),
    [
        (rb"\uDE00", "\\ude00"),  # a low one alone
        (rb"\ude00\ud83d", "\\ude00"),  # a pair in the wrong order
        (rb"\ud83d\ud83d\ude00", "\\ud83d"),  # a high one before a pair
        (rb"\\\\\ud83d", "\\ud83d"),  # after an escaped backslash, a real escape
        (rb"\\ud83d\ude00", "\\ude00"),  # the text "\ud83d", then a real, lone, low escape
    ],
)
def test_every_shape_of_lone_surrogate_is_found(
    tmp_path: Path, escaped: bytes, code_point: str
) -> None:
    raw = line("x", messages=[{"role": "user", "content": "T"}]).replace(
        b'"T"', b'"' + escaped + b'"'
    )
    assert may_hold_lone_surrogate(raw)
    (item,) = read_lines(tmp_path, raw)
    assert isinstance(item, LineError), item
    assert item.message.startswith(
        f"body.messages[0].content contains a lone surrogate ({code_point})"
    )


def test_the_raw_text_check_clears_pairs_without_a_walk() -> None:
    assert not may_hold_lone_surrogate(rb'{"a": "\ud83d\ude00 and \uD83D\uDE00"}')
    assert may_hold_lone_surrogate(rb'{"a": "\ud83d \ude00"}')


def test_check_body_on_its_own_finds_surrogates_and_the_first_field_is_named() -> None:
    """The pure check needs no hint from the reader: by default it walks the body."""
    body = {"messages": [{"role": "user", "content": "a\ud83d"}], "stop": "\udc00"}
    with pytest.raises(InvalidLine) as e:
        check_body(CHAT, {"body": body})
    assert e.value.code == "invalid_request"
    assert e.value.message.startswith("body.messages[0].content contains a lone surrogate")
    assert check_body(CHAT, {"body": body}, scan_text=False) is body
    with pytest.raises(InvalidLine) as e:
        check_custom_id({"custom_id": "\udfff"})
    assert e.value.code == "invalid_custom_id"


def test_the_walk_survives_deep_nesting() -> None:
    deep: Any = "\ud800"
    for _ in range(50_000):
        deep = [deep]
    message = find_lone_surrogate({"x": deep}, "body")
    assert message is not None and message.startswith("body.x[0][0][0]")


# --- seeds -----------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [SEED_MIN, -1, 0, 42, SEED_MAX])
def test_seeds_in_the_signed_64_bit_range_are_accepted(tmp_path: Path, seed: int) -> None:
    (item,) = read_lines(tmp_path, line("x", seed=seed))
    assert isinstance(item, Request), item


@pytest.mark.parametrize("seed", [SEED_MAX + 1, 2**64 - 1, 2**64, 2**70, SEED_MIN - 1, -(2**70)])
def test_seeds_beyond_a_signed_64_bit_integer_are_refused(tmp_path: Path, seed: int) -> None:
    message = f"body.seed must be {SEED_RANGE}, got {seed}"
    for url in (CHAT, COMPLETIONS):
        items = read_lines(tmp_path, line("x", url, seed=seed))
        assert items == [LineError(1, "x", "invalid_request", message)]


def test_the_seed_bound_is_what_torch_takes() -> None:
    """vLLM seeds a torch.Generator with the request's seed: the bound holds there."""
    torch = pytest.importorskip("torch")
    for seed in (SEED_MIN, SEED_MAX):
        torch.Generator().manual_seed(seed)
    for seed in (2**64, 2**70, SEED_MIN - 1):
        with pytest.raises(ValueError, match="Overflow when unpacking long long"):
            torch.Generator().manual_seed(seed)


# --- the echo engine's text parts ------------------------------------------------------------


def test_echo_joins_text_parts_with_newlines_as_the_readme_says() -> None:
    content = [
        {"type": "text", "text": "part one"},
        {"type": "image_url", "image_url": {"url": "x"}},
        {"type": "text", "text": "part two"},
    ]
    request = Request("p", 1, CHAT, {"messages": [{"role": "user", "content": content}]})
    assert echo_text(request) == "part one\npart two"


# --- through the CLI ---------------------------------------------------------------------------


def test_a_job_with_a_surrogate_line_and_a_huge_seed_runs_every_good_line(tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    lines = [
        line("good-1", messages=[{"role": "user", "content": "first"}]),
        SURROGATE_LINE,
        line("good-2", messages=[{"role": "user", "content": "second"}], seed=SEED_MAX),
        line("seed", messages=[{"role": "user", "content": "x"}], seed=2**70),
        line("good-3", messages=[{"role": "user", "content": "third"}]),
        line("idBAD"),
    ]
    src.write_bytes(b"\n".join(lines) + b"\n")
    job = tmp_path / "job"
    submit = submit_echo(src, job)
    assert submit.returncode == 1, submit.stderr  # finished, with invalid lines
    assert "Traceback" not in submit.stderr
    export = cli("export", "--job-dir", str(job))
    assert export.returncode == 0, export.stderr
    assert "3 succeeded, 0 failed, 3 invalid lines" in export.stdout
    out = read_jsonl(job / "output.jsonl")
    answers = {
        o["custom_id"]: o["response"]["body"]["choices"][0]["message"]["content"] for o in out
    }
    assert answers == {"good-1": "first", "good-2": "second", "good-3": "third"}
    errors = [
        (
            e["custom_id"],
            e["error"]["line"],
            e["error"]["code"],
            e["error"]["message"],
            e["response"],
        )
        for e in read_jsonl(job / "errors.jsonl")
    ]
    assert errors == [
        (
            "sur",
            2,
            "invalid_request",
            "body.messages[0].content contains a lone surrogate (\\ud83d) at character 17" + WHY,
            None,
        ),
        ("seed", 4, "invalid_request", f"body.seed must be {SEED_RANGE}, got {2**70}", None),
        (
            None,
            6,
            "invalid_custom_id",
            "custom_id 'id\\ud83d' contains a lone surrogate (\\ud83d) at character 3" + WHY,
            None,
        ),
    ]
    # The journal stays valid UTF-8 JSON, line by line.
    for raw in (job / "journal.jsonl").read_bytes().splitlines():
        json.loads(raw.decode("utf-8"))
    status = cli("status", "--job-dir", str(job), "--json")
    assert json.loads(status.stdout)["status"] == "completed"


def test_a_gzip_input_is_named_as_such_in_one_line(tmp_path: Path) -> None:
    src = tmp_path / "input.jsonl.gz"
    src.write_bytes(gzip.compress(line("a") + b"\n"))
    job = tmp_path / "job"
    r = submit_echo(src, job)
    assert r.returncode == 1
    assert "Traceback" not in r.stderr
    # One line that says what is wrong (no job dir line: no job was made).
    assert r.stderr.strip().splitlines() == [
        f"error: input file {src} is gzip-compressed; decompress it first (gunzip -k {src})"
    ]
    assert not job.exists()


def test_the_raw_text_check_never_misses_a_lone_surrogate() -> None:
    """Every string of up to 4 of these pieces: where the parsed text holds a lone surrogate, the
    raw check says so (it may also say so for escaped backslashes: the walk then decides)."""
    pieces = [rb"\ud83d", rb"\uDE00", rb"\udbff", rb"a", rb"\u00e9", rb"\\", rb"\\ud83d", rb"\n"]
    for n in range(1, 5):
        for combo in itertools.product(pieces, repeat=n):
            raw = b'{"a": "' + b"".join(combo) + b'"}'
            text = json.loads(raw)["a"]
            lone = any("\ud800" <= c <= "\udfff" for c in text)
            if lone:
                assert may_hold_lone_surrogate(raw), raw
            elif b"\\\\" not in raw:
                assert not may_hold_lone_surrogate(raw), raw


def test_export_writes_a_journal_whose_records_hold_lone_surrogates(tmp_path: Path) -> None:
    # Journals written before validation caught them may hold such text: export must not stop.
    from batchrun.job.journal import JournalWriter

    src = write_jsonl(tmp_path / "in.jsonl", [chat_line(c, f"hello {c}") for c in "abc"])
    job = tmp_path / "job"
    assert submit_echo(src, job, progress=True).returncode == 0
    recs = {r["custom_id"]: r for r in journal_records(job)}  # (bodies back from the shards)
    sick = dict(recs["b"], attempt=2)
    sick["body"] = json.loads(json.dumps(sick["body"]))
    sick["body"]["choices"][0]["message"]["content"] = "cut \ud83d here"
    failed = dict(recs["c"], attempt=2, ok=False, status_code=500, body=None,
                  error={"code": "engine_error", "message": "bad \udc80 byte"})  # fmt: skip
    with JournalWriter(job / "journal.jsonl").open() as journal:
        journal.append([sick, failed])
    r = cli("export", "--job-dir", str(job))
    assert r.returncode == 0, r.stderr
    out = {o["custom_id"]: o for o in read_jsonl(job / "output.jsonl")}
    assert out["b"]["response"]["body"]["choices"][0]["message"]["content"] == "cut \ud83d here"
    err = read_jsonl(job / "errors.jsonl")
    assert err[0]["error"]["message"] == "bad \udc80 byte"
    r = cli("export", "--job-dir", str(job), "--parquet")
    assert r.returncode == 0, r.stderr
    frame = pd.read_parquet(job / "results.parquet").set_index("custom_id")
    assert frame.loc["b", "content"] == "cut \ufffd here"
    assert frame.loc["c", "error_message"] == "bad \ufffd byte"
