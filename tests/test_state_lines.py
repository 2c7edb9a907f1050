"""The job's state keeps a request by its input line, a byte each: the parent's memory per request
stays within the 40-byte goal (issue 28), and the state still answers by custom_id."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest

from batchrun.job.journal import JournalWriter
from batchrun.job.journal_records import result_record
from batchrun.job.paths import JobPaths
from batchrun.job.state import FAILED_FINAL, FAILED_RETRYABLE, OK, JobState, replay
from batchrun.openai.records import Outcome

pytestmark = pytest.mark.slow  # out of the fast tier: docs/development.md

N = 200_000
REPLAYED = 20_000  # json.loads under tracemalloc is slow: the per-request cost is the same


def write_journal(path: Path, n: int) -> None:
    """A journal of `n` requests' results, one line each (every 1000th failed, retryably)."""
    line = (
        '{"kind":"result","custom_id":"request-%07d","line":%d,"attempt":1,"ok":%s,'
        '"status_code":200,"body":null,"error":null,"retryable":true,"prompt_tokens":3,'
        '"completion_tokens":5,"latency_s":0.001,"time":1700000000.0}\n'
    )
    with path.open("w") as f:
        f.writelines(line % (i, i + 1, "false" if i % 1000 == 0 else "true") for i in range(n))


def test_the_replayed_state_of_20k_requests_costs_at_most_40_bytes_a_request(
    tmp_path: Path,
) -> None:
    paths = JobPaths(tmp_path)
    n = REPLAYED
    write_journal(paths.journal, n)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        state = replay(paths)
        per_request = (tracemalloc.get_traced_memory()[0] - before) / n
    finally:
        tracemalloc.stop()
    assert per_request <= 40, per_request
    assert (state.done, state.succeeded, state.failed) == (n, n - n // 1000, n // 1000)
    assert state.retryable(3) == {f"request-{i:07d}": 1 for i in range(0, n, 1000)}


def test_results_folded_in_by_line_cost_at_most_40_bytes_a_request(tmp_path: Path) -> None:
    outcomes = [Outcome(f"request-{i:07d}", True, 200) for i in range(N)]
    lines = list(range(1, N + 1))
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        state = JobState(journal=tmp_path / "journal.jsonl")
        for i in range(0, N, 1024):
            state.record_results(outcomes[i : i + 1024], 0, 1.0, lines[i : i + 1024])
        per_request = (tracemalloc.get_traced_memory()[0] - before) / N
    finally:
        tracemalloc.stop()
    assert per_request <= 40, per_request
    assert state.done == state.succeeded == N and state.failed_ids() == set()


def test_a_state_by_line_answers_by_custom_id_as_its_journal_names_the_lines(
    tmp_path: Path,
) -> None:
    paths = JobPaths(tmp_path)
    a, b, c = (
        Outcome(cid, ok, 200, retryable=cid == "b")
        for cid, ok in [("a", True), ("b", False), ("c", False)]
    )
    with JournalWriter(paths.journal) as journal:
        journal.append([result_record(a, 1, 1), result_record(b, 2, 1), result_record(c, 3, 1)])
    state = replay(paths)
    assert dict(state.last) == {"a": OK, "b": FAILED_RETRYABLE, "c": FAILED_FINAL}
    assert state.failed_ids() == {"b", "c"} and state.retryable(3) == {"b": 1}
    # A second attempt at "b" succeeds: counted at its line, named when asked.
    retried = Outcome("b", True, 200)
    assert state.record_results([retried], 0, 2.0, [2]) == [2]
    with JournalWriter(paths.journal) as journal:
        journal.append([result_record(retried, 2, 2)])
    assert dict(state.attempts) == {"a": 1, "b": 2, "c": 1} and state.attempts["b"] == 2
    assert state.failed_ids() == {"c"} and state.retryable(3) == {}
    assert (state.done, state.succeeded, state.failed, state.attempts.total()) == (3, 2, 1, 4)
    assert state.table == replay(paths).table


def test_after_a_forced_resume_requests_are_kept_at_their_current_lines(tmp_path: Path) -> None:
    journal = tmp_path / "journal.jsonl"
    # "a" ran at line 1 and "gone" at line 2 of the old file; the new one has "a" at line 5.
    state = JobState(journal=journal, current={"a": 5, "b": 7})
    state.record(dict(result_record(Outcome("a", False, 500, retryable=True), 1, 1)))
    state.record(dict(result_record(Outcome("gone", True, 200), 2, 1)))
    assert (state.done, state.failed, state.retryable(3)) == (1, 1, {"a": 1})
    assert state.record_results(
        [Outcome("a", True, 200), Outcome("b", True, 200)], 0, 1.0, [5, 7]
    ) == [2, 1]
    assert state.record_results([Outcome("gone", True, 200)], 0, 1.0, [2]) == [1]
    assert (state.done, state.succeeded, state.failed_ids()) == (2, 2, set())
    assert dict(state.attempts) == {"a": 2, "b": 1}
    assert state.table.codes[5] == state.table.codes[7] == OK + 1 and not state.table.by_id
