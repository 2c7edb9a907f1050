"""The journal: append, replay, torn-tail repair, corrupt lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from batchrun.errors import BatchrunError
from batchrun.job.journal import (
    JournalWriter,
    invalid_record,
    read_records,
    repair_tail,
    result_record,
)
from batchrun.job.paths import JobPaths
from batchrun.job.state import replay
from batchrun.openai.records import LineError, Outcome


def outcome(cid: str, ok: bool = True) -> Outcome:
    return Outcome(
        custom_id=cid,
        ok=ok,
        status_code=200 if ok else 500,
        body={"x": 1} if ok else None,
        error=None if ok else {"code": "engine_error", "message": "boom"},
        retryable=not ok,
        prompt_tokens=3,
        completion_tokens=5,
    )


def test_records_round_trip_and_state(tmp_path: Path) -> None:
    paths = JobPaths(tmp_path)
    with JournalWriter(paths.journal) as j:
        j.append([result_record(outcome("a"), 1, 1), result_record(outcome("b", ok=False), 2, 1)])
        j.append(
            [
                invalid_record(LineError(3, None, "invalid_json", "bad")),
                result_record(outcome("b"), 2, 2),
            ]
        )
    recs = list(read_records(paths.journal))
    assert [r["kind"] for r in recs] == ["result", "result", "invalid", "result"]
    state = replay(paths)
    assert state.succeeded == 2 and state.failed == 0 and state.invalid == 1
    assert state.attempts == {"a": 1, "b": 2}
    assert state.completion_tokens == 15


def test_torn_tail_is_cut_on_open_and_whole_lines_survive(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    with JournalWriter(path) as j:
        j.append([result_record(outcome("a"), 1, 1), result_record(outcome("b"), 2, 1)])
    whole = path.read_bytes()
    path.write_bytes(whole + b'{"kind":"result","custom_id":"c","li')
    assert [r["custom_id"] for r in read_records(path)] == ["a", "b"]
    with JournalWriter(path) as j:  # opening for append repairs the tail
        j.append([result_record(outcome("c"), 3, 1)])
    assert path.read_bytes().startswith(whole)
    assert [r["custom_id"] for r in read_records(path)] == ["a", "b", "c"]


def test_repair_of_a_long_torn_line_without_any_newline(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    path.write_bytes(b"x" * 200_000)
    assert repair_tail(path) == 200_000
    assert path.read_bytes() == b""


def test_garbage_line_in_the_middle_is_reported_with_its_line_number(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    good = json.dumps(result_record(outcome("a"), 1, 1))
    path.write_text(good + "\n" + "not json at all\n" + good.replace('"a"', '"b"') + "\n")
    with pytest.raises(BatchrunError, match="corrupt at line 2"):
        list(read_records(path))
    assert [r["custom_id"] for r in read_records(path, strict=False)] == ["a", "b"]


def test_every_append_reaches_the_file_before_sync(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    j = JournalWriter(path, group=10_000, interval_s=3600).open()
    j.append([result_record(outcome("a"), 1, 1)])
    # Not yet fsync'd, but already written: a killed process would not lose it.
    assert b'"custom_id":"a"' in path.read_bytes()
    j.close()


def test_a_record_utf8_cannot_hold_is_written_escaped_and_reads_back(tmp_path: Path) -> None:
    """A lone surrogate (in a model's text, an error message, an old journal's custom_id) must
    never stop the journal: that line is written with \\u escapes, still valid JSON."""
    paths = JobPaths(tmp_path)
    good = result_record(outcome("café"), 1, 1)
    text = result_record(outcome("b"), 2, 1)
    text["body"] = {"content": "cut \ud83d here, caf\u00e9"}
    error = result_record(outcome("c", ok=False), 3, 1)
    error["error"] = {"code": "engine_error", "message": "boom \udc80"}
    odd_id = result_record(outcome("id\udfff"), 4, 1)
    with JournalWriter(paths.journal) as j:
        j.append([good, text, error, odd_id])
    raw = paths.journal.read_bytes()
    lines = raw.splitlines()
    assert len(lines) == 4
    raw.decode("utf-8")  # strict: the file stays UTF-8
    # The fast path is untouched: a record UTF-8 can hold keeps its text as it is.
    assert '"custom_id":"café"'.encode() in lines[0]
    assert b'"content":"cut \\ud83d here, caf\\u00e9"' in lines[1]
    assert [json.loads(x) for x in lines] == [good, text, error, odd_id]
    assert list(read_records(paths.journal)) == [good, text, error, odd_id]
    state = replay(paths)
    assert state.succeeded == 3 and state.failed == 1
