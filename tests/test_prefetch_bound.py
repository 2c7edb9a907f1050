"""Prefetch beyond a worker's window is bounded in prompt characters (run/scheduler.py
MAX_PREFETCH_CHARS), also when long requests follow a short first one; order is kept."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

import support.fakes.workers as ts  # the fake worker and reporter

from batchrun.config import EngineSettings
from batchrun.job.journal import JournalWriter
from batchrun.job.state import JobState
from batchrun.openai.records import CHAT, Request
from batchrun.run.planner import prompt_chars
from batchrun.run.recording import JournalSink
from batchrun.run.scheduler import MAX_PREFETCH_CHARS, Scheduler

LONG = "x" * 1_000_000  # one string shared by every long request: 1 MB, not 200
WINDOW = 64


class HoldingWorker(ts.FakeWorker):
    """The fake worker, noting the prompt characters it holds after each send."""

    held_chars: ClassVar[list[int]] = []

    def send(self, requests: Sequence[Request]) -> None:
        super().send(requests)
        HoldingWorker.held_chars.append(sum(map(prompt_chars, self.inflight.values())))


def request(i: int, text: str) -> Request:
    body = {"messages": [{"role": "user", "content": text}]}
    return Request(custom_id=f"r{i}", line=i + 1, url=CHAT, body=body)


def test_long_requests_after_a_short_one_are_prefetched_by_characters(tmp_path: Path) -> None:
    ts.FakeWorker.received = []
    HoldingWorker.held_chars = []
    reqs = [request(0, "short")] + [request(i, LONG) for i in range(1, 300)]
    settings = EngineSettings(engine="echo", max_num_seqs=WINDOW, window=WINDOW)
    journal = JournalWriter(tmp_path / "journal.jsonl").open()
    scheduler = Scheduler(
        settings, [{}], JournalSink(journal, JobState()), ts.Events(), HoldingWorker
    )
    scheduler.run(iter(reqs))
    journal.close()
    # Each request sent once, in the file's order (those held back went first the next time).
    assert ts.FakeWorker.received == [r.custom_id for r in reqs]
    # The window's requests, and at most MAX_PREFETCH_CHARS more (before: as many again, 64 MB).
    limit = WINDOW * 1_000_000 + MAX_PREFETCH_CHARS
    held = max(HoldingWorker.held_chars)
    assert held <= limit, f"{held:,} prompt characters held"
