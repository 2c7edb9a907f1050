"""Hangs: a worker whose engine stops answering is replaced (--stall-timeout), a request that never
finishes is aborted and fails with code `timeout` (--request-timeout), and a start that never
reports ready is a failed start (--start-timeout).

Through the real CLI and real worker processes, with the echo engine's BATCHRUN_ECHO_HANG_AFTER
(after N results a step never returns) and BATCHRUN_ECHO_HANG_ON (those requests never finish);
the watchdog's decisions and the worker's request clock in process, with fake workers and engines.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest
from support.cli import cli
from support.fakes.workers import begin
from support.jobs import journal_records, rerun, submit_echo
from support.lines import chat_input, read_jsonl
from support.serving import create_batch, lines_of, requests_file, start_server, stop_server
from support.waits import wait_until

from batchrun.config import EngineSettings
from batchrun.errors import BatchrunError
from batchrun.job.journal import JournalWriter
from batchrun.job.state import JobState
from batchrun.openai.records import CHAT, Outcome, Request
from batchrun.run.recording import JournalSink
from batchrun.run.scheduler import Scheduler
from batchrun.run.watchdog import Watchdog, stall_limit, start_limit
from batchrun.workers.child import Feeder
from batchrun.workers.messages import Heartbeat, Inbox, MessageKind, Ready, Restart, Results
from batchrun.workers.process import Worker

# -- through the CLI ------------------------------------------------------------------------------


def submit(src: Path, job: Path, *args: str, env: dict[str, str]) -> Any:
    # The time-out is the test's own: on a batchrun with no watchdog these jobs never end.
    return submit_echo(src, job, "--batch-size", "4", *args, env=env, timeout=90)


@pytest.mark.parametrize("how", ["flag", "env"])
@pytest.mark.slow
def test_a_hung_engine_is_killed_and_replaced_and_every_request_succeeds(
    tmp_path: Path, how: str
) -> None:
    src = chat_input(tmp_path / "in.jsonl", 30, max_tokens=4)
    job = tmp_path / "job"
    env = {"BATCHRUN_ECHO_HANG_AFTER": "10"}
    args: tuple[str, ...] = ("--stall-timeout", "2")
    if how == "env":
        env["BATCHRUN_STALL_TIMEOUT"] = "2"
        args = ()
    started = time.monotonic()
    r = submit(src, job, *args, env=env)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    # Each engine answers 10 and hangs: two hangs, each seen after 2 s with the 8 requests the
    # worker held (a window of 4 and as many again queued), then a fresh worker.
    hung = "[batchrun] worker 0 hung: no result for 2 s with 8 requests in flight; restarting"
    assert r.stderr.count(hung) == 2, r.stderr
    assert r.stderr.count("worker 0 starting echo engine") == 3
    records = journal_records(job)
    assert Counter(rec["custom_id"] for rec in records) == Counter(f"r{i}" for i in range(30))
    # The requests a hung worker held went back to pending: not an attempt, not a failure.
    assert all(rec["ok"] and rec["attempt"] == 1 for rec in records)
    assert time.monotonic() - started < 60
    # The worker's log says why it ends where it does.
    logs = "".join(p.read_text() for p in (job / "logs").glob("*.log"))
    assert "worker 0 hung: no result for 2 s with 8 requests in flight; killed" in logs


@pytest.mark.slow
def test_a_request_slower_than_the_stall_timeout_is_not_a_hang(tmp_path: Path) -> None:
    # Every request takes 3.5 s and none finishes before the stall limit of 2 s: the worker's
    # heartbeats between engine steps keep it alive.
    src = chat_input(tmp_path / "in.jsonl", 4, max_tokens=4)
    job = tmp_path / "job"
    r = submit(src, job, "--stall-timeout", "2", env={"BATCHRUN_ECHO_DELAY_MS": "3500"})
    assert r.returncode == 0, r.stderr
    assert "hung" not in r.stderr
    assert r.stderr.count("worker 0 starting echo engine") == 1
    assert len(journal_records(job)) == 4


@pytest.mark.slow
def test_a_request_past_its_timeout_fails_with_code_timeout_and_retry_failed_runs_it_again(
    tmp_path: Path,
) -> None:
    src = chat_input(tmp_path / "in.jsonl", 12, max_tokens=4)
    job = tmp_path / "job"
    record = tmp_path / "received.txt"
    env = {"BATCHRUN_ECHO_HANG_ON": "r7", "BATCHRUN_ECHO_RECORD": str(record)}
    r = submit(src, job, "--request-timeout", "2", "--max-attempts", "2", env=env)
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr
    # Retryable: the retry pass sent it again, and it timed out again.
    assert "[batchrun] retry pass (attempt 2 of 2): 1 failed request" in r.stderr
    # The worker aborted it in the engine and went on: no restart, no hang.
    assert r.stderr.count("worker 0 starting echo engine") == 1
    records = journal_records(job)
    stuck = [rec for rec in records if rec["custom_id"] == "r7"]
    assert [rec["attempt"] for rec in stuck] == [1, 2]
    message = (
        "the request did not finish within 2 s of reaching the engine (--request-timeout); "
        "it was aborted"
    )
    for rec in stuck:
        assert rec["ok"] is False
        assert rec["retryable"] is True
        assert rec["status_code"] == 504
        assert rec["error"] == {"code": "timeout", "message": message}
        assert 2.0 <= rec["latency_s"] < 10
    others = [rec for rec in records if rec["custom_id"] != "r7"]
    assert sorted(rec["custom_id"] for rec in others) == sorted(
        f"r{i}" for i in range(12) if i != 7
    )
    assert all(rec["ok"] for rec in others)
    assert cli("export", "--job-dir", str(job)).returncode == 0
    errors = read_jsonl(job / "errors.jsonl")
    assert [(e["custom_id"], e["error"]["code"]) for e in errors] == [("r7", "timeout")]

    # Once the engine answers it (the hang gone), retry-failed sends it again.
    record.write_text("")
    r = rerun("retry-failed", job, env={"BATCHRUN_ECHO_RECORD": str(record)}, timeout=90)
    assert r.returncode == 0, r.stderr
    assert record.read_text().split() == ["r7"]
    last = [rec for rec in journal_records(job) if rec["custom_id"] == "r7"][-1]
    assert last["ok"] is True and last["attempt"] == 3


@pytest.mark.slow
def test_under_serve_a_request_past_its_timeout_fails_alone_and_the_batch_completes(
    tmp_path: Path,
) -> None:
    # The engine's ids are "<slot>\x00<custom_id>" there: the abort and the answer must map back.
    server = start_server(
        tmp_path / "root",
        "--request-timeout",
        "2",
        "--max-attempts",
        "1",
        env={"BATCHRUN_ECHO_HANG_ON": "req-0003"},
    )
    try:
        client = server.client()
        batch = create_batch(client, requests_file(tmp_path / "in.jsonl", 6))

        def ended() -> bool:
            return client.batches.retrieve(batch.id).status in ("completed", "failed")

        wait_until(ended, "the batch ends", timeout=60, every=0.2)
        done = client.batches.retrieve(batch.id)
        assert done.status == "completed"
        assert done.request_counts is not None
        assert (done.request_counts.completed, done.request_counts.failed) == (5, 1)
        (error,) = lines_of(client, done.error_file_id)
        assert error["custom_id"] == "req-0003"
        assert error["error"]["code"] == "timeout"
        assert len(lines_of(client, done.output_file_id)) == 5
    finally:
        stop_server(server)


@pytest.mark.parametrize(
    ("option", "value", "says"),
    [
        ("--stall-timeout", "1", "must be at least 2, got 1.0"),
        ("--request-timeout", "0", "must be above 0, got 0.0"),
        ("--start-timeout", "-5", "must be above 0, got -5.0"),
    ],
)
def test_a_timeout_out_of_range_is_a_usage_error(
    tmp_path: Path, option: str, value: str, says: str
) -> None:
    src = chat_input(tmp_path / "in.jsonl", 1, max_tokens=4)
    r = submit_echo(src, tmp_path / "job", option, value, progress=True)
    assert r.returncode == 2
    assert says in " ".join(r.stderr.replace("│", " ").split())
    assert not (tmp_path / "job").exists()


# -- the defaults ---------------------------------------------------------------------------------


def test_the_default_stall_limit_is_five_minutes_or_a_second_per_sequence_running() -> None:
    # A real engine's step over a full batch of long generations can take seconds on a slow
    # device: the default must not call that a hang (this machine's CPU steps take under 1 s).
    assert stall_limit(EngineSettings(window=256), held=512) == 300
    assert stall_limit(EngineSettings(window=8), held=1) == 300
    # A step runs the window's sequences, not the queue behind them.
    assert stall_limit(EngineSettings(window=1024), held=3000) == 1024
    assert stall_limit(EngineSettings(window=1024, stall_timeout=7.5), held=3000) == 7.5
    assert start_limit(EngineSettings()) == 1800
    assert start_limit(EngineSettings(start_timeout=60)) == 60


# -- the watchdog, in process ---------------------------------------------------------------------


class SilentWorker(Worker):
    """Answers every request at once until `hang_after` answers per process, then nothing more:
    an engine whose step never returns. Announces heartbeats unless `beats` is off."""

    hang_after: ClassVar[int | None] = None
    never_ready: ClassVar[bool] = False
    restart_after: ClassVar[int | None] = None
    starts: ClassVar[int] = 0
    kills: ClassVar[int] = 0

    def start(self, inbox: Inbox) -> None:
        begin(self, inbox)
        self._answered = 0
        SilentWorker.starts += 1
        if SilentWorker.never_ready:
            return
        inbox.put((self.index, self.generation, Ready(pid=1, start_s=0.0)))
        inbox.put((self.index, self.generation, Heartbeat(1.0)))

    def send(self, requests: Sequence[Request]) -> None:
        for r in requests:
            self.inflight[r.custom_id] = r
        out = []
        for r in requests:
            if SilentWorker.hang_after is not None and self._answered >= SilentWorker.hang_after:
                break
            self._answered += 1
            out.append(Outcome(custom_id=r.custom_id, ok=True, status_code=200, body={"ok": 1}))
        if out:
            self._inbox.put((self.index, self.generation, Results(out)))
        if SilentWorker.restart_after is not None and self._answered >= SilentWorker.restart_after:
            self._inbox.put((self.index, self.generation, Restart("it cannot abort")))

    def set_window(self, window: int) -> None:
        self.settings.window = window

    def stop(self, timeout: float = 10.0, *, leave: bool = False) -> None:
        self.process = None

    def kill(self) -> None:
        SilentWorker.kills += 1
        self.process = None


@pytest.fixture(autouse=True)
def reset_silent() -> Iterator[None]:
    SilentWorker.hang_after = None
    SilentWorker.never_ready = False
    SilentWorker.restart_after = None
    SilentWorker.starts = 0
    SilentWorker.kills = 0
    yield


class Events:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def event(self, message: str) -> None:
        self.lines.append(message)

    def advance(self, outcomes: Sequence[Outcome]) -> None:
        pass


def requests(n: int) -> list[Request]:
    return [
        Request(custom_id=f"r{i}", line=i + 1, url=CHAT, body={"messages": []}) for i in range(n)
    ]


def scheduler(tmp_path: Path, **settings: Any) -> tuple[Scheduler, Events, JournalWriter]:
    # In process the limits may be far shorter than the CLI allows.
    engine = EngineSettings(engine="echo", max_num_seqs=4, window=4, **settings)
    journal = JournalWriter(tmp_path / "journal.jsonl").open()
    events = Events()
    s = Scheduler(engine, [{}], JournalSink(journal, JobState()), events, SilentWorker)
    return s, events, journal


def test_hung_workers_are_replaced_and_their_requests_run_again_not_as_attempts(
    tmp_path: Path,
) -> None:
    SilentWorker.hang_after = 10
    s, events, journal = scheduler(tmp_path, stall_timeout=0.3)
    stats = s.run(iter(requests(30)))
    s.close()
    journal.close()
    assert stats.succeeded == 30
    hung = [line for line in events.lines if "hung" in line]
    assert hung == ["worker 0 hung: no result for 0.3 s with 8 requests in flight; restarting"] * 2
    assert SilentWorker.kills == 2
    assert SilentWorker.starts == 3
    assert s.sink.state.attempts == {f"r{i}": 1 for i in range(30)}


def test_a_worker_that_hangs_three_times_finishing_nothing_is_given_up(tmp_path: Path) -> None:
    SilentWorker.hang_after = 0
    s, events, journal = scheduler(tmp_path, stall_timeout=0.2)
    with pytest.raises(BatchrunError) as e:
        s.run(iter(requests(5)))
    s.close()
    journal.close()
    assert str(e.value) == (
        "the engine worker hung 3 times in a row without finishing a request (no result for "
        "0.2 s each time); if the engine is only slow, give it longer with --stall-timeout. "
        "Everything finished so far is saved"
    )
    assert SilentWorker.kills == 3
    hung = "worker 0 hung: no result for 0.2 s with 5 requests in flight; restarting"
    assert [line for line in events.lines if "hung" in line] == [hung] * 2
    # Nothing was lost: the requests it held are pending again.
    assert sorted(r.custom_id for r in s.pending) == [f"r{i}" for i in range(5)]


def test_a_worker_that_never_gets_ready_is_a_failed_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BATCHRUN_START_RETRY_DELAY_S", "0")
    SilentWorker.never_ready = True
    s, _events, journal = scheduler(tmp_path, start_timeout=0.2)
    with pytest.raises(BatchrunError) as e:
        s.run(iter(requests(3)))
    s.close()
    journal.close()
    assert "it did not report ready within 0.2 s of its start (waited for the engine to start" in (
        str(e.value)
    )
    # Every start that timed out was killed (a retried start included).
    assert SilentWorker.kills == SilentWorker.starts >= 1


def test_a_worker_that_asks_to_be_replaced_is_and_its_requests_run_again(tmp_path: Path) -> None:
    SilentWorker.hang_after = 2
    SilentWorker.restart_after = 2
    s, events, journal = scheduler(tmp_path)
    stats = s.run(iter(requests(3)))
    s.close()
    journal.close()
    assert stats.succeeded == 3
    assert (
        events.lines.count("worker 0 restarting: it cannot abort; 1 request back to pending") == 1
    )
    assert s.sink.state.attempts == {"r0": 1, "r1": 1, "r2": 1}


class Clock:
    """The watchdog's view of one fake worker, with the time given by hand."""

    def __init__(self) -> None:
        self.w = SilentWorker(index=0, settings=EngineSettings(window=4, stall_timeout=5), env={})
        self.w.process = object()
        self.w.generation = 1
        self.dog = Watchdog()
        self.dog.started(self.w, now=0.0)

    def overdue(self, now: float) -> bool:
        self.dog._next_check = 0.0  # every call looks
        return bool(self.dog.overdue([self.w], now=now))


def test_an_idle_worker_is_not_hung_and_its_clock_starts_with_new_work() -> None:
    c = Clock()
    c.w.ready = True
    c.dog.heard(c.w, MessageKind.READY, now=1.0)
    c.dog.heard(c.w, MessageKind.HEARTBEAT, now=1.0)
    assert not c.overdue(100.0)  # idle for 99 s: nothing owed
    c.w.inflight = {r.custom_id: r for r in requests(2)}
    assert not c.overdue(104.0)
    assert c.overdue(105.5)
    c.dog.heard(c.w, MessageKind.STATS, now=105.6)
    assert not c.overdue(110.0)


def test_a_worker_that_never_announced_heartbeats_is_not_watched_for_stalls() -> None:
    # A Ray actor's relay sends results only: silence there is no sign.
    c = Clock()
    c.w.ready = True
    c.dog.heard(c.w, MessageKind.READY, now=1.0)
    c.w.inflight = {r.custom_id: r for r in requests(2)}
    assert not c.overdue(1000.0)


def test_a_new_process_of_the_worker_starts_with_a_clean_slate() -> None:
    c = Clock()
    c.w.ready = True
    c.dog.heard(c.w, MessageKind.HEARTBEAT, now=1.0)
    c.w.inflight = {r.custom_id: r for r in requests(2)}
    c.w.generation = 2
    c.w.ready = False
    c.dog.started(c.w, now=50.0)
    c.w.ready = True
    assert not c.overdue(1000.0)  # its new process has not announced heartbeats yet


# -- the worker's request clock, in process -------------------------------------------------------


class SlowEngine:
    """Finishes every request at its first step except those in `stuck`."""

    def __init__(self, stuck: set[str]) -> None:
        self.stuck = stuck
        self.running: list[Request] = []
        self.aborted: list[str] = []

    def add(self, request: Request) -> Outcome | None:
        self.running.append(request)
        return None

    def step(self) -> list[Outcome]:
        done = [r for r in self.running if r.custom_id not in self.stuck]
        self.running = [r for r in self.running if r.custom_id in self.stuck]
        return [Outcome(custom_id=r.custom_id, ok=True, status_code=200) for r in done]


class AbortingEngine(SlowEngine):
    def abort(self, custom_id: str) -> None:
        self.aborted.append(custom_id)
        self.running = [r for r in self.running if r.custom_id != custom_id]


def test_a_request_past_its_timeout_is_aborted_in_the_engine() -> None:
    engine = AbortingEngine({"r1"})
    feeder = Feeder(engine, 4, request_timeout=0.1)
    feeder.add(requests(3))
    assert [o.custom_id for o in feeder.pump()] == ["r0", "r2"]
    assert feeder.active == 1
    time.sleep(0.15)
    (out,) = feeder.pump()
    assert engine.aborted == ["r1"]
    assert feeder.idle
    assert (out.custom_id, out.ok, out.status_code, out.retryable) == ("r1", False, 504, True)
    assert out.error is not None and out.error["code"] == "timeout"
    assert out.latency_s >= 0.1
    assert feeder.restart is None


def test_the_clock_starts_when_the_engine_takes_the_request_not_in_the_queue() -> None:
    engine = AbortingEngine({"r0"})
    feeder = Feeder(engine, 1, request_timeout=0.2)
    feeder.add(requests(2))  # r1 waits behind r0: the window holds one
    feeder.pump()
    time.sleep(0.25)
    assert [o.error["code"] for o in feeder.pump() if o.error] == ["timeout"]  # r0's
    # r1 entered only now: it has its whole time, and finishes.
    assert [o.custom_id for o in feeder.pump()] == ["r1"]


def test_an_engine_that_cannot_abort_asks_for_a_fresh_worker() -> None:
    engine = SlowEngine({"r0"})
    feeder = Feeder(engine, 4, request_timeout=0.05)
    feeder.add(requests(1))
    assert feeder.pump() == []
    time.sleep(0.1)
    (out,) = feeder.pump()
    assert out.error is not None and out.error["code"] == "timeout"
    assert feeder.restart == (
        "a request passed --request-timeout 0.05 s and this engine cannot abort it"
    )
    assert feeder.active == 1  # still in the engine, holding its place


def test_without_a_request_timeout_nothing_is_timed() -> None:
    engine = AbortingEngine({"r0"})
    feeder = Feeder(engine, 4)
    feeder.add(requests(1))
    feeder.pump()
    assert feeder.entered == {}


class RecordingVllm:
    """Stands in for vLLM's LLMEngine: records what is aborted."""

    def __init__(self) -> None:
        self.aborted: list[list[str]] = []

    def abort_request(self, request_ids: list[str], internal: bool = False) -> None:
        self.aborted.append(list(request_ids))


def test_the_vllm_engine_aborts_a_request_by_its_id_and_a_pooling_request_by_its_parts() -> None:
    from batchrun.engines.vllm.engine import VllmEngine, _Pending

    engine = VllmEngine.__new__(VllmEngine)  # no model: only the request bookkeeping is tried
    vllm = RecordingVllm()
    engine._engine = vllm
    chat, pooled, other = requests(3)
    engine._in_flight = {
        "r0": _Pending(chat, 0.0),
        "r1": _Pending(pooled, 0.0, work=object(), parts=[None, None], remaining=2),  # type: ignore[arg-type]
        "r2": _Pending(other, 0.0),
    }
    engine._parts = {"r1#0": ("r1", 0), "r1#1": ("r1", 1)}
    engine.abort("r0")
    engine.abort("r1")
    engine.abort("r0")  # no longer running: nothing to do
    assert vllm.aborted == [["r0"], ["r1#0", "r1#1"]]
    assert set(engine._in_flight) == {"r2"}
    assert engine._parts == {}
    assert engine.has_unfinished()  # r2 still runs


@pytest.mark.slow
def test_a_start_that_never_finishes_is_killed_and_started_again(tmp_path: Path) -> None:
    """BATCHRUN_ECHO_START_HANG=1: the first engine start never returns (an NCCL set-up stuck);
    past --start-timeout it is killed with its group, counted as a failed start, and the next
    start runs the job."""
    src = chat_input(tmp_path / "in.jsonl", 6, max_tokens=4)
    job = tmp_path / "job"
    r = submit(src, job, "--start-timeout", "2", env={"BATCHRUN_ECHO_START_HANG": "1"})
    assert r.returncode == 0, r.stderr
    assert "it did not report ready within 2 s of its start" in r.stderr, r.stderr
    assert r.stderr.count("worker 0 starting echo engine") == 2, r.stderr
    assert sorted(rec["custom_id"] for rec in journal_records(job)) == sorted(
        f"r{i}" for i in range(6)
    )
