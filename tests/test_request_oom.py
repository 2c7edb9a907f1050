"""One request whose own memory need is the problem fails alone (`request_oom`), the job goes on
(issue 27, item 5): out-of-memory deaths that follow one request are isolated as crashes are.

Through `batchrun submit --engine echo` (BATCHRUN_ECHO_OOM_ON: a step running that request raises
PyTorch's out-of-memory error, whatever the batch size), and the scheduler in process.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest
from support.cli import cli
from support.fakes.workers import Events, FakeWorker, answered, requests, results
from support.jobs import journal_records, rerun, submit_echo
from support.lines import chat_input, read_jsonl

from batchrun.config import EngineSettings
from batchrun.job.journal import JournalWriter
from batchrun.job.state import JobState
from batchrun.openai.records import Request
from batchrun.run.recording import JournalSink
from batchrun.run.scheduler import Scheduler
from batchrun.workers.messages import Fatal, Inbox


@pytest.mark.slow
def test_one_request_that_runs_out_of_memory_fails_alone_and_the_job_goes_on(
    tmp_path: Path,
) -> None:
    src = chat_input(tmp_path / "in.jsonl", 50, "m")
    job = tmp_path / "job"
    r = submit_echo(
        src,
        job,
        "--batch-size",
        "16",
        "--max-attempts",
        "3",
        env={"BATCHRUN_ECHO_OOM_ON": "r23", "BATCHRUN_ECHO_DELAY_MS": "5"},
    )
    # Exit 1: the job finished with one failed request (it did not fail as a whole).
    assert r.returncode == 1, r.stderr
    assert "error:" not in r.stderr and "out of memory even at batch size 1" not in r.stderr
    records = journal_records(job)
    by_id: dict[str, list[dict[str, Any]]] = {}
    for rec in records:
        by_id.setdefault(rec["custom_id"], []).append(rec)
    assert sorted(by_id) == sorted(f"r{i}" for i in range(50))
    assert all(len(recs) == 1 for recs in by_id.values())  # not retried by the passes either
    ok = [cid for cid, recs in by_id.items() if recs[0]["ok"]]
    assert len(ok) == 49 and "r23" not in ok
    bad = by_id["r23"][0]
    assert (bad["status_code"], bad["retryable"], bad["line"]) == (500, False, 24)
    assert bad["error"]["code"] == "request_oom"
    assert bad["error"]["message"].startswith(
        "the engine ran out of memory running this request on its own (OutOfMemoryError: CUDA "
        "out of memory. Tried to allocate 20.00 GiB (simulated by the echo engine: request 'r23' "
        "is in BATCHRUN_ECHO_OOM_ON)); it needs more memory than the engine has"
    )
    assert "worker 0 ran out of memory running request 'r23' (line 24) on its own: " in r.stderr, (
        r.stderr
    )
    assert "It is recorded as failed (request_oom) and not retried" in r.stderr
    exported = cli("export", "--job-dir", str(job))
    assert exported.returncode == 0, exported.stderr
    errors = read_jsonl(job / "errors.jsonl")
    assert [(e["custom_id"], e["error"]["code"]) for e in errors] == [("r23", "request_oom")]
    # retry-failed sends it again on demand (after a fix), as it does engine_crash.
    again = rerun("retry-failed", job)
    assert "retrying 1 failed request" in again.stderr, again.stderr


class OomOnWorker(FakeWorker):
    """Runs out of memory whenever one of `oom_on` is among what it runs; else answers at once."""

    oom_on: ClassVar[set[str]] = set()

    def send(self, batch: Sequence[Request]) -> None:
        for r in batch:
            self.inflight[r.custom_id] = r
        FakeWorker.received.extend(r.custom_id for r in batch)
        running = list(self.inflight)[: self.settings.window]
        if any(cid in OomOnWorker.oom_on for cid in running):
            self._die(Fatal(oom=True, message="OutOfMemoryError: CUDA out of memory"))
            return
        self._inbox.put((self.index, self.generation, answered(batch, {"ok": True})))

    def start(self, inbox: Inbox) -> None:
        super().start(inbox)


@pytest.fixture(autouse=True)
def reset_oom_on() -> Iterator[None]:
    OomOnWorker.oom_on = set()
    FakeWorker.starts = 0
    FakeWorker.received = []
    yield


def make(tmp_path: Path, window: int) -> tuple[Scheduler, Events, JournalWriter]:
    settings = EngineSettings(engine="echo", max_num_seqs=window, window=window)
    journal = JournalWriter(tmp_path / "journal.jsonl").open()
    events = Events()
    return (
        Scheduler(settings, [{}], JournalSink(journal, JobState()), events, OomOnWorker),
        events,
        journal,
    )


def test_the_same_requests_running_out_twice_are_isolated_not_halved_to_nothing(
    tmp_path: Path,
) -> None:
    # 6 requests, window 64: halving changes nothing of what runs, so the same six run out
    # again; then they are isolated and the one fails alone.
    OomOnWorker.oom_on = {"r4"}
    scheduler, events, journal = make(tmp_path, window=64)
    stats = scheduler.run(iter(requests(6)))
    journal.close()
    by_id = results(tmp_path)
    assert sorted(by_id) == sorted(f"r{i}" for i in range(6))
    assert by_id["r4"][0]["error"]["code"] == "request_oom"
    assert all(recs[0]["ok"] for cid, recs in by_id.items() if cid != "r4")
    assert stats.crashed == 1
    assert [e for e in events.lines if "backing off" in e] == [
        "worker 0: backing off, batch size 64 -> 32"
    ]
    assert any(
        "ran out of memory holding 6 requests" in e and "the one that needs more memory" in e
        for e in events.lines
    )


def test_an_oom_among_a_few_running_requests_goes_to_isolation_at_once(tmp_path: Path) -> None:
    OomOnWorker.oom_on = {"r1"}
    scheduler, events, journal = make(tmp_path, window=4)
    scheduler.run(iter(requests(20)))
    journal.close()
    by_id = results(tmp_path)
    assert len(by_id) == 20 and by_id["r1"][0]["error"]["code"] == "request_oom"
    assert sum(1 for recs in by_id.values() if recs[0]["ok"]) == 19
    assert not any("backing off" in e for e in events.lines)
    assert scheduler.batch_size == 4


def test_a_batch_too_big_still_backs_off_as_before(tmp_path: Path) -> None:
    # Out of memory for the batch's size (more than 5 at once), not one request's: halving.
    FakeWorker.oom_above = 5
    try:
        settings = EngineSettings(engine="echo", max_num_seqs=16, window=16)
        journal = JournalWriter(tmp_path / "journal.jsonl").open()
        scheduler = Scheduler(
            settings, [{}], JournalSink(journal, JobState()), Events(), FakeWorker
        )
        stats = scheduler.run(iter(requests(40)))
        journal.close()
    finally:
        FakeWorker.oom_above = None
    assert stats.succeeded == 40 and stats.crashed == 0 and scheduler.batch_size == 4


def test_a_search_probe_after_an_oom_while_running_ends(tmp_path: Path) -> None:
    """A probe that runs out of memory while running puts what it held back to pending; the next
    probe, with a smaller limit than that, must end at its limit (it waited forever)."""
    from batchrun.run.tuning import search_batch_size

    FakeWorker.oom_above = 5
    try:
        settings = EngineSettings(engine="echo", max_num_seqs=1, window=1)
        journal = JournalWriter(tmp_path / "journal.jsonl").open()
        events = Events()
        scheduler = Scheduler(settings, [{}], JournalSink(journal, JobState()), events, FakeWorker)
        result = search_batch_size(scheduler, iter(requests(400)), events, lo=1, hi=32)
        journal.close()
    finally:
        FakeWorker.oom_above = None
    seen = {p.size: p.ok for p in result.probes}
    assert seen[32] is False and all(ok == (size <= 5) for size, ok in seen.items()), seen
    assert 1 <= result.size <= 5
