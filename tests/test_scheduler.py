"""The scheduler in process, driven by fake workers: poison isolation, requeue, OOM back-off, give-up.

The fake worker answers through the same inbox messages a real worker sends (`Ready`, `Results`,
`Fatal`, `Eof`: workers/messages.py), so everything the scheduler decides is exercised; only the process is missing.
The same behaviour through real worker processes and the CLI is in tests/test_poison.py.
"""

from __future__ import annotations

import gc
import json
import math
import pickle
from collections.abc import Callable, Iterator, Sequence
from multiprocessing.reduction import ForkingPickler
from pathlib import Path

import msgspec
import pytest
from support.fakes.workers import Events, FakeWorker, requests, results

from batchrun.config import EngineSettings
from batchrun.errors import BatchrunError
from batchrun.job.journal import JournalWriter, encode_body
from batchrun.job.state import JobState
from batchrun.openai.records import Outcome, Request
from batchrun.openai.response_bodies import failure
from batchrun.run.memory import fewer_collections
from batchrun.run.recording import JournalSink
from batchrun.run.scheduler import Scheduler
from batchrun.workers.child import GC_THRESHOLD
from batchrun.workers.messages import Eof, Results


@pytest.fixture(autouse=True)
def reset_fake() -> Iterator[None]:
    FakeWorker.poison = set()
    FakeWorker.oom_above = None
    FakeWorker.fail_start = False
    FakeWorker.fail_start_oom = None
    FakeWorker.starts = 0
    FakeWorker.received = []
    yield


def make(
    tmp_path: Path,
    *,
    workers: int = 1,
    window: int = 16,
    on_back_off: Callable[[int], None] | None = None,
) -> tuple[Scheduler, Events, JournalWriter]:
    settings = EngineSettings(engine="echo", max_num_seqs=window, window=window)
    journal = JournalWriter(tmp_path / "journal.jsonl").open()
    events = Events()
    scheduler = Scheduler(
        settings,
        [{} for _ in range(workers)],
        JournalSink(journal, JobState()),
        events,
        FakeWorker,
        on_back_off=on_back_off,
    )
    return scheduler, events, journal


def test_a_poison_request_is_isolated_and_fails_alone(tmp_path: Path) -> None:
    FakeWorker.poison = {"r13"}
    scheduler, events, journal = make(tmp_path, window=16)
    stats = scheduler.run(iter(requests(100)))
    journal.close()
    by_id = results(tmp_path)
    assert sorted(by_id) == sorted(f"r{i}" for i in range(100))
    assert all(len(recs) == 1 for recs in by_id.values())  # each answered exactly once
    bad = by_id["r13"][0]
    assert (bad["ok"], bad["status_code"], bad["retryable"]) == (False, 500, False)
    assert bad["error"]["code"] == "engine_crash"
    assert bad["line"] == 14
    assert all(recs[0]["ok"] for cid, recs in by_id.items() if cid != "r13")
    assert stats.crashed == 1
    # The first send holds window + prefetch (as many again) = 32 requests: one death raised the
    # suspicion, then at most ceil(log2(32)) more to corner the request.
    held = 16 + 16
    assert FakeWorker.starts - 1 <= 1 + math.ceil(math.log2(held))
    found = [e for e in events.lines if "'r13' (line 14) on its own" in e]
    assert len(found) == 1 and "not retried; finding it took" in found[0]
    assert any(
        f"died holding {held} requests" in e and "at most 5 more restarts" in e
        for e in events.lines
    )


def test_several_poison_requests_and_several_workers(tmp_path: Path) -> None:
    FakeWorker.poison = {"r3", "r4", "r50", "r99"}
    scheduler, _, journal = make(tmp_path, workers=3, window=8)
    stats = scheduler.run(iter(requests(100)))
    journal.close()
    by_id = results(tmp_path)
    assert len(by_id) == 100 and all(len(r) == 1 for r in by_id.values())
    crashed = {cid for cid, recs in by_id.items() if not recs[0]["ok"]}
    assert crashed == FakeWorker.poison
    assert stats.crashed == 4 and stats.succeeded == 96


def test_a_death_without_poison_costs_one_restart_and_nothing_is_lost(tmp_path: Path) -> None:
    # A worker killed from outside once (no request is to blame): both halves then finish.
    scheduler, _, journal = make(tmp_path, window=8)
    calls = {"n": 0}
    original = FakeWorker.send

    def dies_once(self: FakeWorker, batch: Sequence[Request]) -> None:
        calls["n"] += 1
        if calls["n"] == 2:
            for r in batch:
                self.inflight[r.custom_id] = r
            self._inbox.put((self.index, self.generation, Eof()))
            return
        original(self, batch)

    FakeWorker.send = dies_once  # type: ignore[method-assign]
    try:
        stats = scheduler.run(iter(requests(40)))
    finally:
        FakeWorker.send = original  # type: ignore[method-assign]
    journal.close()
    by_id = results(tmp_path)
    assert len(by_id) == 40 and all(len(r) == 1 and r[0]["ok"] for r in by_id.values())
    assert stats.crashed == 0 and FakeWorker.starts == 2


def test_an_engine_that_crashes_on_everything_is_given_up_on(tmp_path: Path) -> None:
    FakeWorker.poison = {f"r{i}" for i in range(40)}
    scheduler, _, journal = make(tmp_path, window=4)
    with pytest.raises(BatchrunError) as info:
        scheduler.run(iter(requests(40)))
    journal.close()
    assert str(info.value).startswith(
        "3 requests in a row crashed the engine worker on their own with none finishing in "
        "between, so the engine itself looks broken (last: the worker process died (killed by "
        "signal 9)); they are recorded as failed (engine_crash). Once the engine is fixed, "
        "`batchrun resume --job-dir .` runs the rest and `batchrun retry-failed --job-dir .` runs "
        "them again. Everything finished so far is saved"
    )
    by_id = results(tmp_path)
    assert len(by_id) == 3  # the three found; the rest stay pending for resume
    assert all(r[0]["error"]["code"] == "engine_crash" for r in by_id.values())


def test_a_worker_that_cannot_start_is_given_up_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An unknown start failure may pass (a port race, NCCL): tried again, 3 starts in all.
    monkeypatch.setenv("BATCHRUN_START_RETRY_DELAY_S", "0")
    FakeWorker.fail_start = True
    scheduler, _, journal = make(tmp_path)
    with pytest.raises(BatchrunError) as info:
        scheduler.run(iter(requests(5)))
    journal.close()
    assert str(info.value) == (
        "the engine failed to start 3 times in a row: RuntimeError: no engine. Everything "
        "finished so far is saved"
    )
    assert FakeWorker.starts == 3


# vLLM 0.32's start-up error when the KV cache holds no block (here: --kv-cache-memory-bytes 1024).
NO_CACHE_BLOCKS = (
    "ValueError: No available memory for the cache blocks. Try increasing "
    "`gpu_memory_utilization` when initializing the engine."
)


def test_a_kv_budget_too_small_to_start_is_one_clear_error_not_a_back_off(
    tmp_path: Path,
) -> None:
    FakeWorker.fail_start_oom = NO_CACHE_BLOCKS
    settings = EngineSettings(engine="echo", max_num_seqs=16, window=16, kv_cache_memory_bytes=1024)
    journal = JournalWriter(tmp_path / "journal.jsonl").open()
    scheduler = Scheduler(settings, [{}], JournalSink(journal, JobState()), Events(), FakeWorker)
    with pytest.raises(BatchrunError) as info:
        scheduler.run(iter(requests(5)))
    journal.close()
    assert str(info.value) == (
        "--kv-cache-memory-bytes 1,024 is too small for this model and --max-model-len "
        "(ValueError: No available memory for the cache blocks); give it more, or leave it out "
        "to size the KV cache from --gpu-memory-utilization. Everything finished so far is saved"
    )
    assert FakeWorker.starts == 1  # no back-off: a smaller batch would not fit either


def test_without_a_kv_budget_no_room_for_the_kv_cache_is_one_clear_error_too(
    tmp_path: Path,
) -> None:
    """vLLM 0.32 sizes the KV cache from what --gpu-memory-utilization leaves after the weights
    and its profiling pass: max_num_seqs does not enter into it, so halving cannot help."""
    FakeWorker.fail_start_oom = NO_CACHE_BLOCKS
    scheduler, _, journal = make(tmp_path, window=4)
    with pytest.raises(BatchrunError) as info:
        scheduler.run(iter(requests(5)))
    journal.close()
    assert str(info.value) == (
        "the model leaves no memory for the KV cache (ValueError: No available memory for the "
        "cache blocks); raise --gpu-memory-utilization, or spread the model over more GPUs with "
        "--tensor-parallel-size. Everything finished so far is saved"
    )
    assert FakeWorker.starts == 1


def test_a_worker_on_cores_another_job_runs_on_says_so(tmp_path: Path) -> None:
    settings = EngineSettings(engine="echo", max_num_seqs=4, window=4)
    env = {"BATCHRUN_CPU_AFFINITY": "0,1", "BATCHRUN_CPU_SHARED_WITH": "pid 42, /jobs/a"}
    journal = JournalWriter(tmp_path / "journal.jsonl").open()
    events = Events()
    Scheduler(settings, [env], JournalSink(journal, JobState()), events, FakeWorker).run(
        iter(requests(3))
    )
    journal.close()
    assert events.lines[:2] == [
        "worker 0 starting echo engine (CPU cores 0,1, batch size 4)",
        "worker 0: every CPU core already runs the model of another batchrun job (pid 42, "
        "/jobs/a); both run slowly while they share them. Give each job its own cores with "
        "OMP_NUM_THREADS (half each, say)",
    ]


def test_out_of_memory_backs_off_and_requeues_without_suspicion(tmp_path: Path) -> None:
    FakeWorker.oom_above = 5
    told: list[int] = []
    scheduler, events, journal = make(tmp_path, window=16, on_back_off=told.append)
    stats = scheduler.run(iter(requests(30)))
    journal.close()
    by_id = results(tmp_path)
    assert len(by_id) == 30 and all(r[0]["ok"] and len(r) == 1 for r in by_id.values())
    assert stats.crashed == 0
    assert scheduler.batch_size == 4
    assert told == [8, 4]  # the runner keeps the size running in the job and the size cache
    assert [e for e in events.lines if "backing off" in e] == [
        "worker 0: backing off, batch size 16 -> 8",
        "worker 0: backing off, batch size 8 -> 4",
    ]


def renamed(prefix: str, n: int) -> list[Request]:
    return [msgspec.structs.replace(r, custom_id=prefix + r.custom_id) for r in requests(n)]


def test_resize_keeps_a_running_engine_when_it_is_big_enough(tmp_path: Path) -> None:
    scheduler, _, journal = make(tmp_path, window=16)
    scheduler.run(iter(requests(10)))
    starts = FakeWorker.starts
    scheduler.resize(8)  # smaller: a window change, no restart
    scheduler.run(iter(renamed("s", 10)))
    assert FakeWorker.starts == starts
    scheduler.resize(32)  # bigger: a fresh engine with that many sequences
    scheduler.run(iter(renamed("t", 10)))
    journal.close()
    assert FakeWorker.starts == starts + 1
    assert scheduler.workers[0].settings.max_num_seqs == 32
    assert len(results(tmp_path)) == 30


def test_failed_outcomes_are_plain_outcomes_not_deaths(tmp_path: Path) -> None:
    # A failed outcome (a 500 the engine reported) is not a crash: no isolation, no restart.
    scheduler, _, journal = make(tmp_path)
    original = FakeWorker.send

    def fails(self: FakeWorker, batch: Sequence[Request]) -> None:
        for r in batch:
            self.inflight[r.custom_id] = r
        outcomes = [
            failure(r, "engine_error", "boom", status_code=500, retryable=True) for r in batch
        ]
        self._inbox.put((self.index, self.generation, Results(outcomes)))

    FakeWorker.send = fails  # type: ignore[method-assign]
    try:
        stats = scheduler.run(iter(requests(10)))
    finally:
        FakeWorker.send = original  # type: ignore[method-assign]
    journal.close()
    assert stats.failed == 10 and stats.crashed == 0 and FakeWorker.starts == 1


class WireWorker(FakeWorker):
    """Answers as a real worker's messages arrive: pickled, each body pre-encoded (its JSON)."""

    def send(self, requests: Sequence[Request]) -> None:
        for r in requests:
            self.inflight[r.custom_id] = r
        outcomes = [
            Outcome(
                custom_id=r.custom_id, ok=True, status_code=200,
                body=encode_body({"id": r.custom_id, "lp": [-1e-05 * r.line, 0.5], "n": r.line}),
                prompt_tokens=1, completion_tokens=2, latency_s=[0.0, 5e-06, 0.25][r.line % 3],
            )
            for r in requests
        ]  # fmt: skip
        message = pickle.loads(bytes(ForkingPickler.dumps(Results(outcomes))))
        self._inbox.put((self.index, self.generation, message))


def test_results_sent_as_json_are_journaled_byte_for_byte_as_json_writes_them(
    tmp_path: Path,
) -> None:
    settings = EngineSettings(engine="echo", max_num_seqs=8, window=8)
    journal = JournalWriter(tmp_path / "journal.jsonl").open()
    state = JobState()
    scheduler = Scheduler(settings, [{}], JournalSink(journal, state), Events(), WireWorker)
    stats = scheduler.run(iter(requests(50)))
    journal.close()
    lines = (tmp_path / "journal.jsonl").read_bytes().splitlines(keepends=True)
    assert len(lines) == 50 == stats.succeeded and stats.completion_tokens == 100
    for line in lines:
        rec = json.loads(line)
        assert rec["body"]["id"] == rec["custom_id"] and rec["worker"] == 0
        assert line == json.dumps(rec, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
    assert b'"latency_s":5e-06,' in b"".join(lines)
    assert state.succeeded == 50 and state.per_worker["0"].dump()[:2] == [50, 100]


def test_the_collector_runs_less_often_while_the_scheduler_runs(tmp_path: Path) -> None:
    before = gc.get_threshold()
    seen: list[int] = []

    class Probe(FakeWorker):
        def send(self, requests: Sequence[Request]) -> None:
            seen.append(gc.get_threshold()[0])
            super().send(requests)

    settings = EngineSettings(engine="echo", max_num_seqs=4, window=4)
    journal = JournalWriter(tmp_path / "journal.jsonl").open()
    Scheduler(settings, [{}], JournalSink(journal, JobState()), Events(), Probe).run(
        iter(requests(10))
    )
    journal.close()
    assert seen and set(seen) == {max(before[0], GC_THRESHOLD)}
    assert gc.get_threshold() == before  # restored
    gc.set_threshold(0)  # disabled by the program: left so
    try:
        with fewer_collections():
            assert gc.get_threshold()[0] == 0
    finally:
        gc.set_threshold(*before)
