"""A fake engine worker and reporter for in-process tests of the scheduler: the worker answers
every request at once, except that it dies on a poison id, or runs out of memory above a batch
size, or fails to start, as its class attributes say (reset them between tests)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from batchrun.job.journal import read_records
from batchrun.openai.records import CHAT, Outcome, Request
from batchrun.workers.messages import Eof, Fatal, Inbox, Ready, Results
from batchrun.workers.process import Worker, WorkerDeath


class Events:
    """A reporter that keeps what it was told."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.done: list[str] = []

    def event(self, message: str) -> None:
        self.lines.append(message)

    def advance(self, outcomes: Sequence[Outcome]) -> None:
        self.done.extend(o.custom_id for o in outcomes)


def begin(worker: Worker, inbox: Inbox) -> None:
    """What a start does to a worker in process before its engine says a word: a new generation
    whose process is a stand-in, not ready, nothing answered, no death; `inbox` its messages' way."""
    worker.process = object()  # type: ignore[assignment]
    worker.generation += 1
    worker.ready = False
    worker.results = 0
    worker.death = None
    worker._inbox = inbox  # type: ignore[attr-defined]


def answered(requests: Sequence[Request], body: dict[str, Any]) -> Results:
    """A Results message answering each of `requests` with status 200 and `body`."""
    return Results(
        [Outcome(custom_id=r.custom_id, ok=True, status_code=200, body=body) for r in requests]
    )


class FakeWorker(Worker):
    """Answers every request at once, except that it dies on a poison id (or on too big a batch)."""

    poison: ClassVar[set[str]] = set()
    oom_above: ClassVar[int | None] = None
    fail_start: ClassVar[bool] = False
    fail_start_oom: ClassVar[str | None] = None
    starts: ClassVar[int] = 0
    received: ClassVar[list[str]] = []

    def start(self, inbox: Inbox) -> None:
        begin(self, inbox)
        FakeWorker.starts += 1
        if FakeWorker.fail_start:
            self._die(Fatal(oom=False, message="RuntimeError: no engine"))
            return
        if FakeWorker.fail_start_oom is not None:
            self._die(Fatal(oom=True, message=FakeWorker.fail_start_oom))
            return
        inbox.put((self.index, self.generation, Ready(pid=1, start_s=0.0)))

    def _die(self, last_words: Fatal) -> None:
        self._inbox.put((self.index, self.generation, last_words))
        self._inbox.put((self.index, self.generation, Eof()))

    def send(self, requests: Sequence[Request]) -> None:
        for r in requests:
            self.inflight[r.custom_id] = r
        FakeWorker.received.extend(r.custom_id for r in requests)
        if any(r.custom_id in FakeWorker.poison for r in requests):
            # Like a native crash: the whole batch is lost with the process, no last words.
            self._inbox.put((self.index, self.generation, Eof()))
            return
        running = min(len(self.inflight), self.settings.window)  # the rest wait in its queue
        if FakeWorker.oom_above is not None and running > FakeWorker.oom_above:
            self._die(Fatal(oom=True, message="OutOfMemoryError: CUDA out of memory"))
            return
        self._inbox.put((self.index, self.generation, answered(requests, {"ok": True})))

    def _on_eof(self) -> None:
        if self.death is None:
            self.death = WorkerDeath(
                oom=False,
                message="the worker process died (killed by signal 9)",
                during_start=not self.ready,
            )

    def set_window(self, window: int) -> None:
        self.settings.window = window

    def stop(self, timeout: float = 10.0, *, leave: bool = False) -> None:
        self.process = None


def requests(n: int) -> list[Request]:
    return [
        Request(custom_id=f"r{i}", line=i + 1, url=CHAT, body={"messages": []}) for i in range(n)
    ]


def results(tmp_path: Path) -> dict[str, list[dict[str, Any]]]:
    by_id: dict[str, list[dict[str, Any]]] = {}
    for rec in read_records(tmp_path / "journal.jsonl"):
        by_id.setdefault(rec["custom_id"], []).append(rec)
    return by_id
