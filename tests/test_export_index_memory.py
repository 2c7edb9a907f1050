"""The export's journal index keeps a request by its input line, 17 bytes each: building it for a
job stays within the parent's 40-byte goal per request (issue 28), at its peak too."""

from __future__ import annotations

import json
import random
import tracemalloc
from pathlib import Path

import pytest

from batchrun.errors import BatchrunError
from batchrun.export.index import latest_by_request
from batchrun.job.state import FAILED_RETRYABLE, OK

N = 200_000


def write_journal(path: Path, n: int) -> None:
    """A journal of `n` requests' results in an order other than the file's (as requests finish),
    every 1000th failed retryably and tried again."""
    line = (
        '{"kind":"result","custom_id":"request-%07d","line":%d,"attempt":1,"ok":%s,'
        '"status_code":200,"body":%s,"error":null,"retryable":true,"prompt_tokens":3,'
        '"completion_tokens":5,"latency_s":0.001,"time":1700000000.0}\n'
    )
    body = '{"choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}]}'
    order = list(range(n))
    random.Random(28).shuffle(order)
    with path.open("w") as f:
        f.writelines(line % (i, i + 1, "false" if i % 1000 == 0 else "true", body) for i in order)
        f.writelines(line % (i, i + 1, "false", "null") for i in range(0, n, 1000))


@pytest.mark.slow
def test_the_journal_index_of_200k_requests_peaks_at_most_40_bytes_a_request(
    tmp_path: Path,
) -> None:
    journal = tmp_path / "journal.jsonl"
    write_journal(journal, N)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        index = latest_by_request(journal)  # shapes read, as export --parquet does
        peak = (tracemalloc.get_traced_memory()[1] - before) / N
    finally:
        tracemalloc.stop()
    assert peak <= 40, peak
    entries = list(index)
    assert len(index) == len(entries) == N
    assert [e.line for e in entries] == list(range(1, N + 1))
    assert index.count(OK) == N - N // 1000
    assert index.count(FAILED_RETRYABLE) == N // 1000
    assert [e.attempts for e in entries[:1001:1000]] == [2, 2]
    assert entries[1].attempts == 1


@pytest.mark.parametrize("line", [-1, 2**31])
def test_a_record_at_a_line_no_input_file_has_is_a_corrupt_journal(
    tmp_path: Path, line: int
) -> None:
    """The index's tables are by line: a line past any file's (or negative) is no request's, and
    must not size them."""
    journal = tmp_path / "journal.jsonl"
    records = [
        {"kind": "result", "custom_id": "a", "line": 1, "ok": True, "body": None},
        {"kind": "result", "custom_id": "b", "line": line, "ok": True, "body": None},
    ]
    journal.write_text("".join(json.dumps(r) + "\n" for r in records))
    with pytest.raises(BatchrunError, match="corrupt at line 2;"):
        latest_by_request(journal)
