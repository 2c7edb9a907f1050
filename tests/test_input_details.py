"""Two input details: a key given twice on a line (JSON readers keep the last one silently) is an
error record naming the key, and `--revision` with the echo engine (which loads no model) is
refused instead of being ignored."""

from __future__ import annotations

import json
from pathlib import Path

from support.cli import cli
from support.jobs import submit_echo
from support.lines import chat_line, read_jsonl, read_lines, write_jsonl

from batchrun.openai.records import LineError, Request

WIDE = {"COLUMNS": "400"}
LINE = '{"custom_id": %s, "method": "POST", "url": "/v1/chat/completions", "body": %s}'
BODY = '{"messages": [{"role": "user", "content": "hi"}]}'


def message(key: str, where: str) -> str:
    return (
        f"the key {key!r} is given twice {where}; JSON readers keep the last one silently, so "
        "which one was meant is unknown: give each key once"
    )


def test_two_custom_ids_are_an_error_record_that_names_the_key(tmp_path: Path) -> None:
    """Which custom_id did the user mean? Neither is taken: the record has none."""
    got = read_lines(tmp_path, LINE % ('"a", "custom_id": "b"', BODY), LINE % ('"c"', BODY))
    assert got[0] == LineError(1, None, "duplicate_key", message("custom_id", "on this line"))
    assert isinstance(got[1], Request) and got[1].custom_id == "c"


def test_a_key_given_twice_in_the_body_names_it(tmp_path: Path) -> None:
    body = '{"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 7}'
    got = read_lines(tmp_path, LINE % ('"a"', body))
    assert got == [LineError(1, "a", "duplicate_key", message("max_tokens", "in body"))]


def test_a_key_spelled_with_an_escape_is_the_same_key(tmp_path: Path) -> None:
    """ "custom\\u005fid" is "custom_id": the quoted text alone would not find it."""
    got = read_lines(tmp_path, LINE % ('"a", "custom\\u005fid": "b"', BODY))
    assert got == [LineError(1, None, "duplicate_key", message("custom_id", "on this line"))]


def test_a_key_name_inside_a_value_is_no_duplicate(tmp_path: Path) -> None:
    """Text that looks like a key ("model", "custom_id" in a message) is not one."""
    line = chat_line("a", 'say "custom_id" and "model" and "messages"', max_tokens=3)
    line["body"]["note"] = {"model": "x"}  # a nested object's keys are its own
    got = read_lines(tmp_path, json.dumps(line))
    assert isinstance(got[0], Request), got


def test_a_duplicate_key_line_runs_nothing_and_exports_as_an_error(tmp_path: Path) -> None:
    src = write_jsonl(
        tmp_path / "in.jsonl",
        [LINE % ('"a", "custom_id": "b"', BODY), json.dumps(chat_line("c", "hello"))],
    )
    job = tmp_path / "job"
    r = submit_echo(src, job)
    assert r.returncode == 1, r.stderr
    assert cli("export", "--job-dir", str(job)).returncode == 0
    errors = read_jsonl(job / "errors.jsonl")
    assert [(e["custom_id"], e["error"]) for e in errors] == [
        (
            None,
            {
                "code": "duplicate_key",
                "message": message("custom_id", "on this line"),
                "line": 1,
            },
        )
    ]
    assert [o["custom_id"] for o in read_jsonl(job / "output.jsonl")] == ["c"]


def test_revision_with_the_echo_engine_is_refused(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", [chat_line("a", "hi")])
    job = tmp_path / "job"
    r = submit_echo(src, job, "--revision", "v1", env=WIDE, progress=True)
    assert r.returncode == 2
    assert (
        "Invalid value for '--revision': the echo engine loads no model, so a revision means "
        "nothing to it; leave --revision out"
    ) in r.stderr
    assert not job.exists()


def test_duplicates_are_found_in_every_layout(tmp_path: Path) -> None:
    """Whitespace before the colon, a long line (the quote-hopping test), a line of many quotes
    (parsed again): each names the key; a key given twice deeper than the body is left alone."""
    long_text = "x" * 40_000
    many_quotes = '\\"q\\" ' * 600
    lines = [
        '{"custom_id" : "a", "method": "POST", "url": "/v1/chat/completions", "body" : '
        '{"messages": [{"role": "user", "content": "hi"}], "model" : "m", "model" : "n"}}',
        LINE
        % ('"b"', '{"messages": [{"role": "user", "content": "%s"}], "n": 1, "n": 2}')
        % long_text,
        LINE
        % ('"c", "method": "POST"', '{"messages": [{"role": "user", "content": "%s"}]}')
        % many_quotes,
        LINE % ('"d"', '{"messages": [{"role": "user", "role": "user", "content": "deep"}]}'),
    ]
    got = read_lines(tmp_path, *lines)
    assert [(g.custom_id, getattr(g, "message", None)) for g in got] == [
        ("a", message("model", "in body")),
        ("b", message("n", "in body")),
        ("c", message("method", "on this line")),
        ("d", None),
    ]
