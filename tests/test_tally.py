"""The one per-record step of a job's counts (job/tally.py): active time as a union of the
attempts' time in the engine, and a group of results counted as each of them would be."""

from __future__ import annotations

import itertools
import random

import pytest

from batchrun.job.tally import CACHED, COPY, ENGINE, ActiveTime, Tally


def covered(*intervals: tuple[float, float]) -> float:
    active = ActiveTime()
    for start, end in intervals:
        active.add(start, end)
    return active.seconds


def test_active_time_is_the_union_of_the_intervals_with_gaps_left_out() -> None:
    assert covered() == 0.0
    assert covered((10.0, 11.0)) == pytest.approx(1.0)
    # Overlapping ones count once; the 3 s with nothing in the engine are not counted.
    assert covered((10.0, 11.0), (10.5, 12.0), (15.0, 16.0)) == pytest.approx(3.0)
    # A long attempt spanning shorter ones adds only what they did not cover.
    assert covered((10.0, 11.0), (11.0, 12.0), (9.0, 12.5)) == pytest.approx(3.5)


def test_a_late_result_reaching_back_across_a_gap_closes_it() -> None:
    # [10, 11], then a gap, then [13, 14]; then a result that was in the engine from 10.5 to
    # 14.2: the engine was never idle, the gap was only the order results came in.
    assert covered((10.0, 11.0), (13.0, 14.0), (10.5, 14.2)) == pytest.approx(4.2)


def test_results_ending_together_give_the_same_union_in_any_order() -> None:
    before = [(1.0, 2.0), (4.0, 5.0)]
    together = [(4.5, 6.0), (3.0, 6.0), (5.9, 6.0), (1.5, 6.0)]
    expected = covered(*before, (1.5, 6.0))  # the longest of them alone
    for order in itertools.permutations(together):
        assert covered(*before, *order) == pytest.approx(expected)


def test_a_group_counts_as_each_of_its_results_would() -> None:
    rng = random.Random(7)
    for _ in range(200):
        one_by_one, grouped = Tally(), Tally()
        t = 100.0
        for _ in range(rng.randint(1, 6)):
            t += rng.choice([0.0, 0.2, 3.0])
            worker = rng.choice([0, 1])
            results = [
                (
                    rng.choice([0.0, 0.1, 1.0, 5.0]),  # latency
                    rng.randint(0, 9),  # prompt tokens
                    rng.randint(0, 9),  # generated
                    rng.random() < 0.7,  # new
                    rng.choice([1, 0, 0, -1]),  # ok change
                    rng.choice([ENGINE, ENGINE, COPY, CACHED]),
                )
                for _ in range(rng.randint(1, 5))
            ]
            for latency, prompt, completion, new, change, source in results:
                one_by_one.add(t, latency, prompt, completion, new, change, source, worker, None)
            engine = [r for r in results if r[5] == ENGINE]
            grouped.add_group(
                t, worker, len(results), sum(r[3] for r in results), sum(r[4] for r in results),
                sum(r[1] for r in results), sum(r[2] for r in results), len(engine),
                sum(r[2] for r in engine), sum(r[5] == COPY for r in results),
                sum(r[5] == COPY and r[3] for r in results), max((r[0] for r in engine), default=0.0),
            )  # fmt: skip
        assert grouped == one_by_one


def test_a_duplicate_copied_again_in_each_retry_pass_is_deduplicated_once() -> None:
    """A failed representative's retries copy their failure to its duplicate again: one request
    answered from an identical one, three attempts that no engine ran."""
    tally = Tally()
    for attempt in (1, 2, 3):
        t = 100.0 + attempt
        tally.add(t, 0.5, 3, 0, attempt == 1, 0, ENGINE, 0, None)  # the representative
        tally.add(t, 0.5, 3, 0, attempt == 1, 0, COPY, 0, None)  # its duplicate
    assert (tally.attempts, tally.engine_attempts, tally.deduplicated, tally.cache_hits) == (
        6, 3, 1, 0,
    )  # fmt: skip


def test_a_worker_counts_only_what_its_engine_ran() -> None:
    tally = Tally()
    tally.add(100.0, 0.5, 3, 4, True, 1, ENGINE, 0, None)
    tally.add(100.0, 0.5, 3, 4, True, 1, COPY, 0, None)  # a copy carries its worker's index
    tally.add(100.0, 0.0, 3, 4, True, 1, CACHED, None, None)
    worker = tally.per_worker["0"]
    assert (worker.attempts, worker.completion_tokens) == (1, 4)
    assert worker.active.seconds == pytest.approx(0.5)
    assert worker.tokens_per_s() == 8.0
    assert (tally.attempts, tally.engine_attempts, tally.deduplicated, tally.cache_hits) == (
        3, 1, 1, 1,
    )  # fmt: skip
    # What the summary file keeps reads back the same.
    assert Tally.load(tally.dump()) == tally
