"""Export: output.jsonl / errors.jsonl (OpenAI batch format) and results.parquet from a journal."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai.types
import pandas as pd
import pyarrow.parquet as pq
import pytest
from openai.types.chat import ChatCompletion

from batchrun.errors import BatchrunError
from batchrun.export.index import INVALID, PENDING, latest_by_request
from batchrun.export.job import export_jsonl, export_parquet
from batchrun.export.jsonl import ERRORS_NAME, OUTPUT_NAME
from batchrun.export.parquet import PARQUET_NAME
from batchrun.job.inputmap import InputMap
from batchrun.job.journal import JournalWriter, invalid_record, result_record
from batchrun.job.state import FAILED_RETRYABLE, OK
from batchrun.openai.records import CHAT, COMPLETIONS, LineError, Outcome, Request
from batchrun.openai.response_bodies import Choice, failure, success


def chat(custom_id: str, line: int) -> Request:
    return Request(
        custom_id,
        line,
        CHAT,
        {"model": "tiny-chat", "messages": [{"role": "user", "content": "hi"}]},
    )


def completion(custom_id: str, line: int) -> Request:
    return Request(custom_id, line, COMPLETIONS, {"model": "tiny-cmpl", "prompt": "once"})


def ok(req: Request, text: str = "hello", n: int = 1) -> Outcome:
    choices = [Choice(f"{text}{i or ''}", "stop", 3) for i in range(n)]
    return success(req, choices, model="default-model", prompt_tokens=5, latency_s=0.25)


def bad(req: Request, status: int = 500) -> Outcome:
    return failure(
        req, "engine_error", "worker died", status_code=status, retryable=True, latency_s=0.5
    )


def write_journal(path: Path, records: list[dict[str, Any]]) -> Path:
    with JournalWriter(path) as w:
        w.append(records)
    return path


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text("utf-8").splitlines()]


@pytest.fixture
def mixed(tmp_path: Path) -> Path:
    """A journal with every case, written out of line order as a scheduler would."""
    c1, c2, c3, c4 = chat("c1", 2), completion("c2", 3), chat("c3", 5), chat("c4", 6)
    return write_journal(
        tmp_path / "journal.jsonl",
        [
            invalid_record(LineError(4, None, "invalid_json", "line 4 is not JSON")),
            result_record(ok(c3, "three"), 5, 1),
            result_record(bad(c1), 2, 1),  # fails first ...
            result_record(ok(c2, "two", n=2), 3, 1),
            invalid_record(LineError(1, "c3", "duplicate_custom_id", "c3 appears twice")),
            result_record(ok(c4, "four"), 6, 1),  # succeeds first ...
            result_record(ok(c1, "one"), 2, 2),  # ... then succeeds on the retry
            result_record(bad(c4, 400), 6, 2),  # ... then fails: export reports the last
        ],
    )


def test_output_bodies_parse_with_the_openai_types(tmp_path: Path, mixed: Path) -> None:
    out = tmp_path / "out"
    summary = export_jsonl(tmp_path, mixed, out)
    lines = read_jsonl(out / OUTPUT_NAME)
    assert [x["custom_id"] for x in lines] == ["c1", "c2", "c3"]
    chat1 = ChatCompletion.model_validate(lines[0]["response"]["body"])
    assert chat1.choices[0].message.content == "one"
    cmpl = openai.types.Completion.model_validate(lines[1]["response"]["body"])
    assert [c.text for c in cmpl.choices] == ["two", "two1"]
    for x in lines:
        assert set(x) == {"id", "custom_id", "response", "error"}
        assert x["id"].startswith("batch_req_")
        assert x["error"] is None
        assert x["response"]["status_code"] == 200
        assert isinstance(x["response"]["request_id"], str) and x["response"]["request_id"]
    assert len({x["id"] for x in lines}) == len(lines)
    assert (summary.succeeded, summary.failed, summary.invalid) == (3, 1, 2)
    assert summary.paths == (out / OUTPUT_NAME, out / ERRORS_NAME)


def test_retry_that_succeeds_is_only_in_output(tmp_path: Path, mixed: Path) -> None:
    export_jsonl(tmp_path, mixed, tmp_path)
    assert "c1" in {x["custom_id"] for x in read_jsonl(tmp_path / OUTPUT_NAME)}
    assert "c1" not in {x["custom_id"] for x in read_jsonl(tmp_path / ERRORS_NAME)}


def test_success_then_failure_is_only_in_errors(tmp_path: Path, mixed: Path) -> None:
    export_jsonl(tmp_path, mixed, tmp_path)
    assert "c4" not in {x["custom_id"] for x in read_jsonl(tmp_path / OUTPUT_NAME)}
    errors = read_jsonl(tmp_path / ERRORS_NAME)
    (c4,) = [x for x in errors if x["custom_id"] == "c4"]
    assert c4["response"]["status_code"] == 400
    assert c4["response"]["body"] is None
    assert c4["error"] == {"code": "engine_error", "message": "worker died", "line": 6}


def test_invalid_lines_are_errors_with_line_numbers_in_line_order(
    tmp_path: Path, mixed: Path
) -> None:
    export_jsonl(tmp_path, mixed, tmp_path)
    errors = read_jsonl(tmp_path / ERRORS_NAME)
    assert [x["error"]["line"] for x in errors] == [1, 4, 6]
    dup, nojson = errors[0], errors[1]
    # A duplicate line keeps the id it repeats, yet is its own error line, apart from c3's result.
    assert dup["custom_id"] == "c3" and dup["response"] is None
    assert dup["error"] == {"code": "duplicate_custom_id", "message": "c3 appears twice", "line": 1}
    assert nojson["custom_id"] is None and nojson["response"] is None
    assert nojson["error"]["code"] == "invalid_json"
    assert "c3" in {x["custom_id"] for x in read_jsonl(tmp_path / OUTPUT_NAME)}


def test_reexport_is_byte_identical(tmp_path: Path, mixed: Path) -> None:
    export_jsonl(tmp_path, mixed, tmp_path / "a")
    export_jsonl(tmp_path, mixed, tmp_path / "b")
    for name in (OUTPUT_NAME, ERRORS_NAME):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_ids_differ_between_jobs_with_the_same_custom_ids(tmp_path: Path) -> None:
    ids = []
    for job in ("j1", "j2"):
        (tmp_path / job).mkdir()
        journal = write_journal(
            tmp_path / job / "journal.jsonl", [result_record(ok(chat("a", 1)), 1, 1)]
        )
        export_jsonl(tmp_path / job, journal, tmp_path / job)
        ids.append(read_jsonl(tmp_path / job / OUTPUT_NAME)[0]["id"])
    assert ids[0] != ids[1]


def test_torn_last_journal_line_is_ignored(tmp_path: Path, mixed: Path) -> None:
    with mixed.open("ab") as f:
        f.write(json.dumps(result_record(bad(chat("c3", 5)), 5, 2)).encode()[:40])
    summary = export_jsonl(tmp_path, mixed, tmp_path)
    assert (summary.succeeded, summary.failed, summary.invalid) == (3, 1, 2)
    assert "c3" in {x["custom_id"] for x in read_jsonl(tmp_path / OUTPUT_NAME)}


def test_corrupt_journal_line_is_a_clear_error(tmp_path: Path, mixed: Path) -> None:
    lines = mixed.read_bytes().splitlines(keepends=True)
    mixed.write_bytes(b"".join([*lines[:3], b"{not json\n", *lines[3:]]))
    with pytest.raises(BatchrunError, match="corrupt at line 4"):
        export_jsonl(tmp_path, mixed, tmp_path)


def test_journal_line_that_is_not_utf8_is_a_clear_error(tmp_path: Path, mixed: Path) -> None:
    lines = mixed.read_bytes().splitlines(keepends=True)
    mixed.write_bytes(
        b"".join([*lines[:2], lines[2].replace(b"worker died", b"w\xff"), *lines[3:]])
    )
    with pytest.raises(BatchrunError, match="corrupt at line 3"):
        export_jsonl(tmp_path, mixed, tmp_path)


def test_index_keeps_last_record_offset_and_attempts(mixed: Path) -> None:
    index = latest_by_request(mixed)
    entries = list(index)
    assert [e.line for e in entries] == [1, 2, 3, 4, 5, 6]
    assert [e.attempts for e in entries] == [0, 2, 1, 0, 1, 2]
    with mixed.open("rb") as f:
        f.seek(entries[1].offset)
        last_c1 = json.loads(f.readline())
    assert (last_c1["custom_id"], last_c1["attempt"], last_c1["ok"]) == ("c1", 2, True)


def test_index_with_an_input_map_is_of_the_file_as_it_is_now(mixed: Path) -> None:
    """After a forced resume: c3 left the file, the others moved, c5 is new (pending), and only
    the invalid lines the map's generation tagged are the file's."""
    with JournalWriter(mixed) as w:
        moved = LineError(7, None, "invalid_json", "line 7 is not JSON")
        w.append([{**invalid_record(moved), "generation": "g2"}])
        w.append([{**invalid_record(LineError(8, None, "invalid_json", "x")), "generation": "g1"}])
    current = InputMap("g2", {"c5": 1, "c4": 2, "c1": 3, "c2": 4})
    index = latest_by_request(mixed, current)
    rows = [(e.line, e.status, e.attempts) for e in index]
    assert rows == [
        (1, PENDING, 0),
        (2, FAILED_RETRYABLE, 2),
        (3, OK, 2),
        (4, OK, 1),
        (7, INVALID, 0),
    ]
    # Without a map (the file never changed), a forced resume's tagged records are not the job's.
    assert [e.line for e in latest_by_request(mixed)] == [1, 2, 3, 4, 5, 6]


def test_missing_or_empty_journal_exports_empty_files(tmp_path: Path) -> None:
    summary = export_jsonl(tmp_path, tmp_path / "journal.jsonl", tmp_path)
    assert summary.total == 0
    assert (tmp_path / OUTPUT_NAME).read_bytes() == b""
    assert (tmp_path / ERRORS_NAME).read_bytes() == b""
    export_parquet(tmp_path / "journal.jsonl", tmp_path)
    df = pd.read_parquet(tmp_path / PARQUET_NAME)
    assert len(df) == 0 and "custom_id" in df.columns


PARQUET_COLUMNS = [
    "custom_id",
    "line",
    "status",
    "status_code",
    "content",
    "finish_reason",
    "n_choices",
    "model",
    "prompt_tokens",
    "completion_tokens",
    "total_tokens",
    "cached_tokens",
    "reasoning_tokens",
    "error_code",
    "error_message",
    "attempts",
    "latency_s",
    "response_id",
]


def test_parquet_rows_columns_dtypes_and_values(tmp_path: Path, mixed: Path) -> None:
    summary = export_parquet(mixed, tmp_path / "out")
    df = pd.read_parquet(tmp_path / "out" / PARQUET_NAME)
    assert summary.paths == (tmp_path / "out" / PARQUET_NAME,)
    assert list(df.columns) == PARQUET_COLUMNS
    assert len(df) == 6
    assert df["line"].tolist() == [1, 2, 3, 4, 5, 6]
    assert df["status"].tolist() == [
        "invalid",
        "succeeded",
        "succeeded",
        "invalid",
        "succeeded",
        "failed",
    ]
    for col in (
        "line",
        "prompt_tokens",
        "completion_tokens",
        "total_tokens",
        "cached_tokens",
        "reasoning_tokens",
    ):
        assert df[col].dtype == "int64", col
    for col in ("n_choices", "attempts"):
        assert df[col].dtype == "int32", col
    assert df["status_code"].dtype == "Int32"
    assert df["latency_s"].dtype == "float64"
    for col in ("custom_id", "status", "content", "error_code", "response_id"):
        assert pd.api.types.is_string_dtype(df[col]), col

    rows = df.set_index("line")
    c1 = rows.loc[2]
    assert (c1["custom_id"], c1["attempts"], c1["status_code"]) == ("c1", 2, 200)
    assert (c1["content"], c1["finish_reason"], c1["n_choices"]) == ("one", "stop", 1)
    assert c1["model"] == "default-model"
    assert (c1["prompt_tokens"], c1["completion_tokens"], c1["total_tokens"]) == (5, 3, 8)
    assert c1["latency_s"] == 0.25
    assert c1["response_id"].startswith("chatcmpl-")
    assert pd.isna(c1["error_code"]) and pd.isna(c1["error_message"])
    c2 = rows.loc[3]
    assert (c2["content"], c2["n_choices"], c2["completion_tokens"]) == ("two", 2, 6)
    assert c2["response_id"].startswith("cmpl-")
    c4 = rows.loc[6]
    assert (c4["custom_id"], c4["attempts"], c4["status_code"]) == ("c4", 2, 400)
    assert (c4["error_code"], c4["error_message"]) == ("engine_error", "worker died")
    assert pd.isna(c4["content"]) and pd.isna(c4["response_id"]) and c4["n_choices"] == 0
    assert c4["latency_s"] == 0.5
    nojson = rows.loc[4]
    assert pd.isna(nojson["custom_id"]) and pd.isna(nojson["status_code"])
    assert (nojson["error_code"], nojson["attempts"]) == ("invalid_json", 0)
    assert pd.isna(nojson["latency_s"])
    assert rows.loc[1, "custom_id"] == "c3"


def test_parquet_status_code_dtype_is_stable_without_invalid_lines(tmp_path: Path) -> None:
    journal = write_journal(tmp_path / "j.jsonl", [result_record(ok(chat("a", 1)), 1, 1)])
    export_parquet(journal, tmp_path)
    assert pd.read_parquet(tmp_path / PARQUET_NAME)["status_code"].dtype == "Int32"


def test_parquet_is_written_in_row_groups(tmp_path: Path) -> None:
    records = [result_record(ok(chat(f"r{i}", i)), i, 1) for i in range(1, 26)]
    journal = write_journal(tmp_path / "j.jsonl", records)
    summary = export_parquet(journal, tmp_path, row_group_size=10)
    path = tmp_path / PARQUET_NAME
    assert pq.ParquetFile(path).num_row_groups == 3
    assert summary.succeeded == 25
    df = pd.read_parquet(path)
    assert df["custom_id"].tolist() == [f"r{i}" for i in range(1, 26)]


def test_atomic_write_leaves_no_temp_files(tmp_path: Path, mixed: Path) -> None:
    out = tmp_path / "out"
    export_jsonl(tmp_path, mixed, out)
    export_parquet(mixed, out)
    assert sorted(p.name for p in out.iterdir()) == sorted([OUTPUT_NAME, ERRORS_NAME, PARQUET_NAME])


def test_uncreatable_out_dir_is_a_clear_error(tmp_path: Path, mixed: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(BatchrunError, match="cannot create the output directory"):
        export_jsonl(tmp_path, mixed, blocker / "out")
    with pytest.raises(BatchrunError, match="cannot create the output directory"):
        export_parquet(mixed, blocker / "out")
    with pytest.raises(BatchrunError, match="no job directory"):
        export_jsonl(tmp_path / "nojob", mixed, tmp_path / "out")


@contextlib.contextmanager
def _unwritable_dir(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A directory export cannot write to, and the reason it should give: its permissions, or
    for root (whom permissions do not stop) a read-only file system mounted on it."""
    locked = tmp_path / "locked"
    locked.mkdir()
    if os.geteuid() != 0:
        locked.chmod(stat.S_IRUSR | stat.S_IXUSR)
        try:
            yield locked, "permission denied"
        finally:
            locked.chmod(stat.S_IRWXU)
        return
    mount = ["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(locked)]
    if subprocess.run(mount, capture_output=True).returncode != 0:
        pytest.skip("root ignores directory permissions, and no read-only file system mounts here")
    try:
        yield locked, "read-only file system"
    finally:
        subprocess.run(["umount", str(locked)], check=True)


def test_unwritable_out_dir_is_a_clear_error(tmp_path: Path, mixed: Path) -> None:
    with _unwritable_dir(tmp_path) as (locked, reason):
        message = f"cannot write to the output directory {locked}: {reason}; choose another"
        with pytest.raises(BatchrunError, match=re.escape(message)):
            export_jsonl(tmp_path, mixed, locked)
        with pytest.raises(BatchrunError, match=re.escape(message)):
            export_parquet(mixed, locked)


def test_failed_write_is_a_clear_error_and_keeps_the_old_file(
    tmp_path: Path, mixed: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    export_jsonl(tmp_path, mixed, tmp_path)
    before = (tmp_path / OUTPUT_NAME).read_bytes()

    def no_space(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("batchrun.job.files.os.fsync", no_space)
    with pytest.raises(BatchrunError, match="No space left on device"):
        export_jsonl(tmp_path, mixed, tmp_path)
    with pytest.raises(BatchrunError, match="No space left on device"):
        export_parquet(mixed, tmp_path)
    monkeypatch.undo()
    assert (tmp_path / OUTPUT_NAME).read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["journal.jsonl", OUTPUT_NAME, ERRORS_NAME]
    )


def test_exported_files_get_the_usual_permissions(tmp_path: Path, mixed: Path) -> None:
    umask = os.umask(0o022)
    try:
        export_jsonl(tmp_path, mixed, tmp_path / "out")
        export_parquet(mixed, tmp_path / "out")
    finally:
        os.umask(umask)
    for name in (OUTPUT_NAME, ERRORS_NAME, PARQUET_NAME):
        assert stat.S_IMODE((tmp_path / "out" / name).stat().st_mode) == 0o644, name


# --- the fast paths (msgspec) and the json paths write the same ------------------------------


def _body_record(custom_id: str, line: int, body: Any, ok: bool = True) -> dict[str, Any]:
    return {
        "kind": "result",
        "custom_id": custom_id,
        "line": line,
        "attempt": 1,
        "ok": ok,
        "status_code": 200 if ok else 500,
        "body": body,
        "error": None if ok else {"code": "engine_error", "message": "m"},
        "retryable": False,
        "prompt_tokens": 1,
        "completion_tokens": 2,
        "latency_s": 0.5,
        "time": 1.0,
    }


TOOL_CALLS = [
    {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{\n  "city": "Z\u00fcrich \\"N\\""\n}'},
    },
    {"id": "call_1_1", "type": "function", "function": {"name": "get_time", "arguments": "{}"}},
]


@pytest.fixture
def shapes(tmp_path: Path, mixed: Path) -> Path:
    """`mixed`, plus answers with logprobs, embeddings and tool calls, floats json writes its own
    way, text with escapes, and a line written by hand (not compact)."""
    logprobs = {
        "tokens": ["a", "b"],
        "token_logprobs": [-0.25, -1e-05],
        "top_logprobs": [{"a": -0.25, "x": -2.0}, None],
    }
    chat_logprobs = {
        "content": [
            {"token": "hi", "logprob": -0.5, "top_logprobs": [{"token": "hi", "logprob": -0.5}]}
        ]
    }
    records = [
        _body_record(
            "lp",
            7,
            {
                "id": "cmpl-1",
                "model": "m",
                "choices": [{"text": "ab", "logprobs": logprobs, "finish_reason": "length"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3},
            },
        ),
        _body_record(
            "chat-lp",
            8,
            {
                "id": "chatcmpl-1",
                "choices": [
                    {
                        "message": {"content": 'a\x00\u2028"\\u0041 0.00001'},
                        "logprobs": chat_logprobs,
                        "finish_reason": "stop",
                    }
                ],
            },
        ),
        _body_record(
            "emb",
            9,
            {
                "model": "e",
                "data": [{"embedding": [0.5, 1, 1e16]}, {"embedding": "AACAPwAAAEAAAEBA"}],
            },
        ),
        _body_record("emb-failed", 10, {"data": [{"embedding": [1.0]}]}, ok=False),
        _body_record("tools", 12, {"choices": [{"message": {"content": None, "tool_calls": []}}]}),
        _body_record(
            "tool-call",
            16,
            {
                "id": "chatcmpl-2",
                "choices": [
                    {
                        "message": {"role": "assistant", "content": None, "tool_calls": TOOL_CALLS},
                        "finish_reason": "tool_calls",
                    }
                ],
            },
        ),
        _body_record(
            "details",
            14,
            {
                "choices": [{"message": {"content": "d"}, "finish_reason": "stop"}],
                "usage": {
                    "prompt_tokens": 300,
                    "completion_tokens": 9,
                    "total_tokens": 309,
                    "prompt_tokens_details": {"cached_tokens": 256},
                    "completion_tokens_details": {"reasoning_tokens": 5},
                },
            },
        ),
        _body_record(
            "response-details",
            15,
            {
                "object": "response",
                "status": "completed",
                "output": [{"type": "message", "content": [{"type": "output_text", "text": "r"}]}],
                "usage": {
                    "input_tokens": 200,
                    "output_tokens": 7,
                    "total_tokens": 207,
                    "input_tokens_details": {"cached_tokens": 128},
                    "output_tokens_details": {"reasoning_tokens": 3},
                },
            },
        ),
    ]
    with JournalWriter(mixed) as w:
        w.append(records)
    # As older journals hold them: NaN as json writes it; a line not compact.
    nan = _body_record("nan", 11, {"choices": [{"text": "x", "extra": float("nan")}]})
    spaced = _body_record("spaced", 13, {"choices": [{"text": "s"}], "model": "m"})
    with mixed.open("ab") as f:
        f.write(json.dumps(nan, separators=(",", ":")).encode() + b"\n")
        f.write(json.dumps(spaced).encode() + b"\n")
    return mixed


class _Refuses:
    """A decoder that refuses everything: the json paths run."""

    def decode(self, raw: object) -> Any:
        import msgspec

        raise msgspec.DecodeError("refused, to test the json path")


def test_records_msgspec_refuses_are_read_as_json_reads_them(tmp_path: Path, shapes: Path) -> None:
    export_jsonl(tmp_path, shapes, tmp_path / "out")
    data = (tmp_path / "out" / OUTPUT_NAME).read_bytes()
    lines = {x["custom_id"]: x for x in map(json.loads, data.splitlines())}  # bytes: \n only
    assert lines["nan"]["response"]["body"]["choices"][0]["text"] == "x"
    assert lines["chat-lp"]["response"]["body"]["choices"][0]["message"]["content"] == (
        'a\x00\u2028"\\u0041 0.00001'
    )
    assert lines["spaced"]["response"]["body"] == {"choices": [{"text": "s"}], "model": "m"}
    export_parquet(shapes, tmp_path / "out")
    df = pd.read_parquet(tmp_path / "out" / PARQUET_NAME).set_index("custom_id")
    assert df.loc["nan", "content"] == "x"
    assert [t["token"] for t in df.loc["lp", "logprobs"]] == ["a", "b"]
    assert len(df.loc["emb", "embeddings"]) == 2 and df.loc["emb", "n_choices"] == 2
    _assert_token_details(df)


def _assert_token_details(df: pd.DataFrame) -> None:
    """The prompt tokens found cached and the reasoning tokens, from chat's usage and from a
    Response's (its own names); 0 where a body reports none."""
    details = df.loc[["details", "response-details", "lp"], ["cached_tokens", "reasoning_tokens"]]
    assert details.values.tolist() == [[256, 5], [128, 3], [0, 0]]
    assert df.loc["response-details", "content"] == "r"


def test_parquet_has_the_token_details_usage_reports(tmp_path: Path, shapes: Path) -> None:
    export_parquet(shapes, tmp_path / "out")
    _assert_token_details(pd.read_parquet(tmp_path / "out" / PARQUET_NAME).set_index("custom_id"))


def test_parquet_has_the_first_choices_tool_calls(tmp_path: Path, shapes: Path) -> None:
    """Each call's id, type, name and arguments (the JSON text, as the body holds it); null for
    a row without calls, an empty list (vLLM's server writes one for none) included."""
    export_parquet(shapes, tmp_path / "out")
    path = tmp_path / "out" / PARQUET_NAME
    field = pq.read_schema(path).field("tool_calls")
    assert str(field.type) == (
        "list<element: struct<id: string, type: string, name: string, arguments: string>>"
    )
    df = pd.read_parquet(path).set_index("custom_id")
    calls = df.loc["tool-call", "tool_calls"]
    assert [dict(c) for c in calls] == [
        {"id": c["id"], "type": c["type"], **c["function"]} for c in TOOL_CALLS
    ]
    assert json.loads(calls[0]["arguments"]) == {"city": 'Z\u00fcrich "N"'}
    assert pd.isna(df.loc["tool-call", "content"])
    for row in ("tools", "details", "lp", "response-details", "emb"):
        assert df.loc[row, "tool_calls"] is None, row
    assert df.loc[df.index.isna(), "tool_calls"].isna().all()  # invalid lines


def test_fast_paths_write_the_bytes_the_json_paths_write(
    tmp_path: Path, shapes: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    export_jsonl(tmp_path, shapes, tmp_path / "fast")
    export_parquet(shapes, tmp_path / "fast", row_group_size=4)
    for name in (
        "index._INDEX_DECODER",
        "index._SHAPED_DECODER",
        "jsonl._RESULT_DECODER",
        "jsonl._RECORD_DECODER",
        "parquet._DECODER",
    ):
        monkeypatch.setattr(f"batchrun.export.{name}", _Refuses())
    export_jsonl(tmp_path, shapes, tmp_path / "json")
    export_parquet(shapes, tmp_path / "json", row_group_size=4)
    for name in (OUTPUT_NAME, ERRORS_NAME, PARQUET_NAME):
        assert (tmp_path / "fast" / name).read_bytes() == (tmp_path / "json" / name).read_bytes()
