"""Tests of batchrun.run.source: a run pass after a validating pass reads the input cheaply, and
yields exactly the Requests the full reader would, or hands over to the full reader."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from batchrun.openai.reader import read_input
from batchrun.openai.records import CHAT, COMPLETIONS, LineError, Request
from batchrun.openai.routing import KnownModels
from batchrun.openai.token_ids import Vocabularies
from batchrun.run import source
from batchrun.run.source import InputIndex, fast_requests, requests


def chat(cid: Any, text: str = "Hi", **body: Any) -> bytes:
    b: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": text}]}
    b.update(body)
    return json.dumps({"custom_id": cid, "method": "POST", "url": CHAT, "body": b}).encode()


# Every kind of line the full reader skips or refuses, among valid ones of every shape.
LINES: list[bytes] = [
    b"\xef\xbb\xbf" + chat("a", "first, after a BOM"),
    chat("b", "crlf") + b"\r",  # joined with \n below: a CRLF line
    b"",  # blank
    b"   \t\r",  # whitespace only, CRLF
    chat("c", "caf\u00e9 \U0001f600", temperature=0.7, top_p=1, max_tokens=16, seed=2**40),
    b'{"custom_id": "d", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "m",'
    b' "messages": [{"role": "user", "content": "odd numbers"}], "n": 1, "x": -0.0,'
    b' "y": 1E2, "z": 12345678901234567890123, "w": "\\u00e9\\ud83d\\ude00\\n\\"q\\""}}',
    chat("a", "a duplicate of line 1"),
    chat("b", "a duplicate of line 2") + b"\r",
    b"{not json",
    b"[1, 2, 3]",
    chat(7, "custom_id not a string"),
    chat("e", messages="not a list"),
    chat("f", temperature=9),
    json.dumps(
        {"custom_id": "g", "method": "POST", "url": COMPLETIONS, "body": {"prompt": "mixed"}}
    ).encode(),
    chat("h", model="another-model"),
    chat("e", "valid now, though line 12 named e first"),  # a duplicate all the same
    b"  " + chat("i", "leading whitespace") + b"  ",
    b'{"custom_id": "j", "method": "GET", "url": "/v1/chat/completions", "body": {}}',
    chat("k", "last, CRLF") + b"\r",
    b"\r",
]


def write(path: Path, lines: list[bytes]) -> Path:
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def shown(items: Iterator[Request | LineError] | list[Request]) -> list[tuple[str, int, str, str]]:
    """The Requests as comparable tuples; the body as JSON, so key order and types count too."""
    return [
        (r.custom_id, r.line, r.url, json.dumps(r.body)) for r in items if isinstance(r, Request)
    ]


def indexed(path: Path) -> InputIndex:
    index = InputIndex()
    for _ in index.read(path):
        pass
    assert index.ready
    return index


def refuse_the_full_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if the fast pass hands over to the full reader from here on."""

    def refuse(path: Path) -> Iterator[Request | LineError]:
        raise AssertionError("the fast pass fell back to the full reader")

    monkeypatch.setattr(source, "read_input", refuse)


def test_the_index_records_the_invalid_lines_and_one_fingerprint_per_request(
    tmp_path: Path,
) -> None:
    path = write(tmp_path / "in.jsonl", LINES)
    index = indexed(path)
    errors = [i.line for i in read_input(path) if isinstance(i, LineError)]
    assert list(index.invalid) == errors and len(errors) == 11
    assert len(index.ids) == len(shown(read_input(path))) == 6


def test_the_fast_pass_yields_what_the_full_reader_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(tmp_path / "in.jsonl", LINES)
    expected = shown(read_input(path))
    assert [c for c, *_ in expected] == ["a", "b", "c", "d", "i", "k"]
    index = indexed(path)
    refuse_the_full_reader(monkeypatch)
    assert shown(fast_requests(path, index)) == expected
    assert shown(fast_requests(path, index)) == expected  # every pass, not the first only


def test_the_fast_pass_keeps_the_filter(tmp_path: Path) -> None:
    path = write(tmp_path / "in.jsonl", LINES)
    index = indexed(path)
    got = requests(path, lambda r: r.custom_id in {"b", "i"}, index)
    assert [(r.custom_id, r.line) for r in got] == [("b", 2), ("i", 17)]


def test_a_file_changed_since_the_validating_pass_is_read_in_full(tmp_path: Path) -> None:
    path = write(tmp_path / "in.jsonl", LINES)
    index = indexed(path)
    # Appended to: its stats differ.
    write(path, [*LINES, chat("z", "added")])
    assert shown(fast_requests(path, index)) == shown(read_input(path))
    assert shown(fast_requests(path, index))[-1][0] == "z"
    # Replaced by another file of the same size, the old times put back on it.
    index = indexed(write(path, LINES))
    st = os.stat(path)
    other = write(tmp_path / "other.jsonl", [line.replace(b'"c"', b'"C"') for line in LINES])
    os.replace(other, path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(path).st_size == st.st_size
    got = shown(fast_requests(path, index))
    assert got == shown(read_input(path)) and "C" in [c for c, *_ in got]


def test_a_change_the_stats_miss_hands_over_at_the_first_surprise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Were the stats the same (say the file was rewritten in place within one clock tick), a
    custom_id whose fingerprint differs, or a line that no longer decodes, hands the rest of
    the pass to the full reader: no request is yielded twice or lost."""
    path = write(tmp_path / "in.jsonl", LINES)
    index = indexed(path)
    calls: list[Path] = []

    def counted(
        p: Path, known: KnownModels | None = None, vocab: Vocabularies | None = None
    ) -> Iterator[Request | LineError]:
        calls.append(p)
        return read_input(p, known, vocab)

    monkeypatch.setattr(source, "read_input", counted)
    for changed in (
        # Three custom_ids renamed (a fingerprint can collide by chance: three cannot).
        [
            line.replace(b'"c"', b'"C"').replace(b'"d"', b'"D"').replace(b'"k"', b'"K"')
            for line in LINES
        ],
        # A valid line that is no longer JSON; a line of an object with no body.
        [*LINES[:4], b"{oops", *LINES[5:]],
        [*LINES[:4], b'{"custom_id": "c"}', *LINES[5:]],
        # Fewer lines than indexed.
        LINES[:6],
    ):
        write(path, changed)
        index.stats = source._stats(os.stat(path))  # as if the stats had not changed
        calls.clear()
        assert shown(fast_requests(path, index)) == shown(read_input(path))
        assert calls == [path]


def test_a_line_msgspec_refuses_hands_over_to_the_full_reader(tmp_path: Path) -> None:
    """Python's decoder takes a number beyond a float's range (as inf) and a lone surrogate's
    escape; msgspec does not. Where the reader let such a line through, the full reader goes on
    from it."""
    lines = [
        chat("a"),
        b'{"custom_id": "b", "method": "POST", "url": "/v1/chat/completions", "body": {"model":'
        b' "m", "messages": [{"role": "user", "content": "Hi"}]}, "note": "\\ud800"}',
        b'{"custom_id": "c", "method": "POST", "url": "/v1/chat/completions", "body": {"model":'
        b' "m", "messages": [{"role": "user", "content": "Hi"}], "x": 1e400}}',
        chat("d"),
    ]
    path = write(tmp_path / "in.jsonl", lines)
    expected = shown(read_input(path))
    assert [c for c, *_ in expected] == ["a", "b", "c", "d"]
    assert shown(fast_requests(path, indexed(path))) == expected


def test_an_index_is_ready_only_after_a_whole_read(tmp_path: Path) -> None:
    path = write(tmp_path / "in.jsonl", LINES)
    index = InputIndex()
    items = index.read(path)
    next(items)
    assert not index.ready
    items.close()
    assert not index.ready
    # requests() with an index not ready reads in full and records it for the next pass.
    first = shown(requests(path, lambda r: True, index))
    assert index.ready and first == shown(read_input(path))
    # A file changed while it was being read leaves no index.
    index = InputIndex()
    for n, _ in enumerate(index.read(path)):
        if n == 0:
            with path.open("ab") as f:
                f.write(chat("late") + b"\n")
    assert not index.ready


def test_submit_runs_its_passes_without_validating_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """submit reads the input for validating, the run and each retry pass; the full reader
    only once."""
    from batchrun.run.jobs import RunOptions, submit

    path = write(tmp_path / "in.jsonl", LINES)
    calls: list[Path] = []
    real = source.read_input

    def counted(
        p: Path, known: KnownModels | None = None, vocab: Vocabularies | None = None
    ) -> Iterator[Request | LineError]:
        calls.append(p)
        return real(p, known, vocab)

    monkeypatch.setattr(source, "read_input", counted)
    monkeypatch.setenv("BATCHRUN_ECHO_FAIL", "c")  # a 500 every time: two retry passes
    options = RunOptions(batch_size=4, max_attempts=3, progress=False)
    options.settings.engine = "echo"
    summary = submit(path, tmp_path / "job", options, notify=lambda _: None)
    assert calls == [path]
    assert summary.state.attempts["c"] == 3
    assert summary.state.succeeded == 5 and summary.state.invalid == 11
    assert summary.exit_code == 1
