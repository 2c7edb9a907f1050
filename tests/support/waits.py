"""Waiting in a test: `wait_until` and its conditions. Every wait fails loudly on time-out."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from support.jobs import journal_records


def wait_until(
    condition: Callable[[], object], what: str, timeout: float = 120, every: float = 0.05
) -> None:
    """Poll `condition` until it holds; fail the test, saying `what` never happened, on time-out
    (a wait that runs out silently lets a test go on to assert on the wrong moment)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting until {what}")
        time.sleep(every)


def results_at_least(job: Path, n: int) -> Callable[[], bool]:
    """A condition: the job's journal holds at least `n` records."""
    return lambda: (job / "journal.jsonl").exists() and len(journal_records(job)) >= n
