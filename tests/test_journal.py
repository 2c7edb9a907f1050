"""The journal: append, replay, torn-tail repair, corrupt lines."""

from __future__ import annotations

import json
import os
import random
import threading
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
from support.waits import wait_until

from batchrun.errors import BatchrunError
from batchrun.job import journal as journal_module
from batchrun.job.journal import (
    JournalWriter,
    encode_body,
    encode_record,
    encode_records,
    invalid_record,
    plain_float,
    plain_result,
    read_records,
    repair_tail,
    result_record,
)
from batchrun.job.paths import JobPaths
from batchrun.job.state import JobState, replay
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


# --- the fast encoder: msgspec, with json's bytes ---------------------------------------------


def json_line(record: dict[str, Any]) -> bytes:
    """The journal line as json writes it (the format the journal has always had)."""
    return json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


AWKWARD_FLOATS = [
    0.0, -0.0, 1.0, -2.5, 0.1, 1e-4, 9.999e-05, 1e-05, 1.234e-05, 5e-06, -1e-7, 2.5e-324,
    1e15, 9999999999999998.0, 1e16, -1.5e16, 1.2345678901234567e17, 1e22, 1.7976931348623157e308,
    1763881234.123, 0.000123, -9999.0, 0.30000000000000004,
]  # fmt: skip


def test_every_record_is_written_byte_for_byte_as_json_writes_it() -> None:
    rng = random.Random(7)
    floats = AWKWARD_FLOATS + [rng.uniform(-1, 1) * 10 ** rng.randint(-30, 30) for _ in range(2000)]
    text = (
        'plain, café, 日本, 🙂, \x00\x1f\x7f \u2028\u2029 "quoted" back\\slash 1e-5 0.00001 3e16,'
    )
    records: list[dict[str, Any]] = []
    for i, x in enumerate(floats):
        records.append(
            {
                "kind": "result",
                "custom_id": f"id-{i}",
                "n": [x, {"v": x}, -x],
                "big": 2**70 + i,
                "text": text[: i % len(text)],
                "ok": i % 2 == 0,
                "none": None,
                "latency_s": x,
            }
        )
    for rec in records:
        assert encode_record(rec) == json_line(rec), rec
    assert encode_records(records) == b"".join(map(json_line, records))
    plain = [r for r in records if all(plain_float(v) for v in r["n"] if isinstance(v, float))]
    assert encode_records(plain, plain=True) == b"".join(map(json_line, plain))


def test_nan_and_infinities_are_written_as_null() -> None:
    """The one difference from json's output: json writes NaN and Infinity, which are not JSON
    (a strict reader rejects the line); msgspec writes null."""
    line = encode_record({"x": [float("nan"), float("inf"), 1.5]})
    assert line == b'{"x":[null,null,1.5]}\n'


def test_a_pre_encoded_body_is_written_as_it_is() -> None:
    body = {"id": "cmpl-1", "choices": [{"text": "hi", "logprobs": None}], "usage": {"n": 3}}
    tiny = {"data": [{"embedding": [1e-05, -2.5e-7, 0.25, 1e17]}]}
    for value in (body, tiny):
        raw = encode_body(value)
        assert isinstance(raw, msgspec.Raw)
        assert bytes(raw) == json_line(value)[:-1]
        ok = Outcome(custom_id="a", ok=True, status_code=200, body=raw, latency_s=5e-06)
        rec = result_record(ok, 3, 1)
        # Below 1e-4, msgspec's text for a float is not json's: the record holds json's.
        assert rec["latency_s"] == msgspec.Raw(b"5e-06")
        expected = json_line({**rec, "body": value, "latency_s": 5e-06})
        assert b'"latency_s":5e-06,' in expected
        assert encode_record(rec) == expected
        assert encode_records([rec], plain=True) == expected
        assert plain_result(ok)
    assert bytes(encode_body(body, floats=False)) == json_line(body)[:-1]
    # UTF-8 cannot hold it: it stays an object, and its line is escaped as a whole, as before.
    odd = {"content": "cut \ud83d here"}
    assert encode_body(odd) is odd


def test_a_journal_of_pre_encoded_bodies_reads_back_and_replays(tmp_path: Path) -> None:
    paths = JobPaths(tmp_path)
    bodies = [{"x": i, "text": f"t{i}", "lp": -1e-05 * i} for i in range(5)]
    with JournalWriter(paths.journal) as j:
        j.append(
            [
                result_record(
                    Outcome(custom_id=f"r{i}", ok=True, status_code=200, body=encode_body(b)),
                    i + 1,
                    1,
                )
                for i, b in enumerate(bodies)
            ]
        )
    assert [r["body"] for r in read_records(paths.journal)] == bodies
    assert replay(paths).succeeded == 5


def test_record_results_folds_outcomes_as_replaying_their_records_does(tmp_path: Path) -> None:
    outcomes = [outcome("a"), outcome("b", ok=False), outcome("c"), outcome("b")]
    outcomes[1].retryable = False
    direct = JobState()
    numbers = direct.record_results(outcomes[:3], 2, 1700000000.125)
    numbers += direct.record_results(outcomes[3:], 2, 1700000001.5)
    assert numbers == [1, 1, 1, 2]
    replayed = JobState()
    for o, n, t in zip(outcomes, numbers, [1700000000.125] * 3 + [1700000001.5], strict=True):
        rec = result_record(o, 1, n, t)
        rec["worker"] = 2
        replayed.record(rec)
    assert direct == replayed
    # After a forced resume, an outcome for a line no longer in the input is not counted.
    limited = JobState(current={"a"})
    assert limited.record_results(outcomes[:2], 0, 1.0) == [1, 1]
    worker = limited.per_worker["0"]
    assert limited.attempts == {"a": 1} and (worker.attempts, worker.completion_tokens) == (1, 5)


# --- fsync in the background --------------------------------------------------------------


class FsyncSpy:
    def __init__(self, fail: bool = False) -> None:
        self.calls = 0
        self.fail = fail
        self.real = os.fsync

    def __call__(self, fd: int) -> None:
        self.calls += 1
        if self.fail:
            raise OSError(5, "Input/output error")
        self.real(fd)


def test_fsync_runs_in_the_background_within_the_interval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = FsyncSpy()
    monkeypatch.setattr(journal_module.os, "fsync", spy)
    # An existing journal: a new one's directory is fsync'd once at open (its name durable).
    (tmp_path / "journal.jsonl").touch()
    j = JournalWriter(tmp_path / "journal.jsonl", interval_s=0.05).open()
    j.append([result_record(outcome("a"), 1, 1)])
    assert spy.calls == 0  # append does not wait for the disk
    wait_until(
        lambda: spy.calls == 1, "fsync has run 1 time(s)", timeout=10, every=0.005
    )  # nothing new: no more fsyncs
    time.sleep(0.15)
    assert spy.calls == 1
    j.append([result_record(outcome("b"), 2, 1)])
    wait_until(lambda: spy.calls == 2, "fsync has run 2 time(s)", timeout=10, every=0.005)
    j.close()
    assert spy.calls == 2  # everything was already synced


def test_a_full_group_is_synced_at_once_and_close_syncs_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = FsyncSpy()
    monkeypatch.setattr(journal_module.os, "fsync", spy)
    (tmp_path / "journal.jsonl").touch()  # as above
    j = JournalWriter(tmp_path / "journal.jsonl", group=3, interval_s=3600).open()
    j.append([result_record(outcome("a"), 1, 1)])
    time.sleep(0.1)
    assert spy.calls == 0
    j.append([result_record(outcome("b"), 2, 1), result_record(outcome("c"), 3, 1)])
    wait_until(lambda: spy.calls == 1, "fsync has run 1 time(s)", timeout=10, every=0.005)
    j.append([result_record(outcome("d"), 4, 1)])
    j.close()  # a normal end (or a graceful stop) syncs before it returns
    assert spy.calls == 2
    assert [r["custom_id"] for r in read_records(tmp_path / "journal.jsonl")] == list("abcd")


def test_sync_does_not_return_while_a_background_fsync_is_under_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The background fsync counts its records out as it begins: a sync() then must not take
    "nothing unsynced" for "all on the disk" (a serve batch marked done, a power cut after)."""
    real = journal_module.os.fsync
    entered, release = threading.Event(), threading.Event()
    by: list[str] = []

    def fsync(fd: int) -> None:
        by.append(threading.current_thread().name)
        if threading.current_thread().name == "batchrun-journal-fsync":
            entered.set()
            release.wait(10)
        real(fd)

    monkeypatch.setattr(journal_module.os, "fsync", fsync)
    (tmp_path / "journal.jsonl").touch()  # no directory fsync at open
    j = JournalWriter(tmp_path / "journal.jsonl", interval_s=0.01).open()
    try:
        j.append([result_record(outcome("a"), 1, 1)])
        assert entered.wait(10)  # the background fsync holds "a", and has not returned
        j.sync()
        assert by == ["batchrun-journal-fsync", threading.current_thread().name]
    finally:
        release.set()
        j.close()


def test_a_failed_background_fsync_stops_the_next_append(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = FsyncSpy(fail=True)
    monkeypatch.setattr(journal_module.os, "fsync", spy)
    (tmp_path / "journal.jsonl").touch()  # no directory fsync at open (see above)
    j = JournalWriter(tmp_path / "journal.jsonl", interval_s=0.01).open()
    j.append([result_record(outcome("a"), 1, 1)])
    wait_until(lambda: spy.calls == 1, "fsync has run 1 time(s)", timeout=10, every=0.005)
    time.sleep(0.05)
    with pytest.raises(BatchrunError, match="cannot sync the journal"):
        j.append([result_record(outcome("b"), 2, 1)])
    monkeypatch.setattr(journal_module.os, "fsync", spy.real)
    j.close()


def test_a_large_append_is_written_in_order_in_writes_of_bounded_size(tmp_path: Path) -> None:
    """Records of large pre-encoded bodies (embeddings) go in several writes of about
    WRITE_BYTES each, whole records in each, in order; small ones in one."""
    path = tmp_path / "journal.jsonl"
    writes: list[bytes] = []

    class Watcher:
        def written(self, offset: int, data: bytes) -> None:
            writes.append(data)

        def closed(self, offset: int) -> None:
            pass

    big = [
        {"kind": "result", "custom_id": f"b{i}", "body": msgspec.Raw(b'"' + b"A" * 6000 + b'"')}
        for i in range(100)
    ]
    small = [{"kind": "result", "custom_id": f"s{i}", "body": None} for i in range(100)]
    with JournalWriter(path) as w:
        w.watcher = Watcher()
        w.append(big, plain=True)
        assert len(writes) > 1
        assert all(x.endswith(b"\n") and len(x) <= journal_module.WRITE_BYTES for x in writes)
        writes.clear()
        w.append(small)
        assert len(writes) == 1
    assert [r["custom_id"] for r in read_records(path)] == [
        *(f"b{i}" for i in range(100)),
        *(f"s{i}" for i in range(100)),
    ]
