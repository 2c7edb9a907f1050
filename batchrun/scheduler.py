"""Pending work -> engine workers -> journal, with no batch barriers.

Each worker is kept topped up with its window of requests plus a little prefetch; every outcome is
journaled the moment it arrives. When a worker dies, the requests it held go back to the front of
the pending queue (they do not count as an attempt), and a fresh worker starts: with half the batch
size when the death was an out-of-memory failure.
"""

from __future__ import annotations

import dataclasses
import queue
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from batchrun.config import EngineSettings
from batchrun.errors import BatchrunError
from batchrun.job import JobState
from batchrun.journal import JournalWriter, result_record
from batchrun.records import Outcome, Request
from batchrun.sizing import back_off
from batchrun.supervisor import Worker

# A worker that dies this many times in a row without finishing a request is given up on.
MAX_DEATHS_WITHOUT_PROGRESS = 3


class Reporter(Protocol):
    """What the scheduler tells the person watching."""

    def event(self, message: str) -> None:
        """Something happened that a person should see (a worker started, died, backed off)."""
        ...

    def advance(self, outcomes: Sequence[Outcome]) -> None:
        """These outcomes were journaled."""
        ...


@dataclass
class RunStats:
    """What one run of the scheduler did."""

    outcomes: int = 0
    succeeded: int = 0
    failed: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    oom: bool = False

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens per second of this run."""
        return self.completion_tokens / self.seconds if self.seconds > 0 else 0.0


class Scheduler:
    """Feeds requests to one or more engine workers and journals what comes back."""

    def __init__(
        self,
        settings: EngineSettings,
        worker_envs: Sequence[dict[str, str]],
        journal: JournalWriter,
        state: JobState,
        reporter: Reporter,
        worker_class: type[Worker] = Worker,
    ) -> None:
        self.journal = journal
        self.state = state
        self.reporter = reporter
        self.inbox: queue.Queue[tuple[int, int, str, Any]] = queue.Queue()
        self.workers = [
            worker_class(index=i, settings=dataclasses.replace(settings), env=dict(env))
            for i, env in enumerate(worker_envs)
        ]
        self.pending: deque[Request] = deque()
        self.worker_info: dict[str, dict[str, Any]] = {}

    # -- sizing ---------------------------------------------------------------------------------

    @property
    def batch_size(self) -> int:
        """The window of the first live worker (all workers share one size unless one backed off)."""
        for w in self.workers:
            if not w.retired:
                return w.settings.window
        return 0

    def resize(self, size: int) -> None:
        """Run `size` requests at once per worker.

        A running engine at least that big just gets a smaller window (no restart); a stopped one,
        or one too small, starts afresh with exactly that many sequences.
        """
        for w in self.workers:
            if w.retired:
                continue
            if w.process is not None and size <= w.settings.max_num_seqs:
                w.set_window(size)
                continue
            if w.process is not None:
                self._requeue(w)
                w.stop()
            w.settings.max_num_seqs = size
            w.settings.window = size

    def peak_memory_mb(self) -> float | None:
        """The largest peak memory any worker reported."""
        peaks = [w.peak_memory_mb for w in self.workers if w.peak_memory_mb is not None]
        return max(peaks) if peaks else None

    # -- the loop -------------------------------------------------------------------------------

    def run(
        self, source: Iterator[Request], *, limit: int | None = None, stop_on_oom: bool = False
    ) -> RunStats:
        """Run requests from `pending` then `source` until both are empty (or `limit` were taken).

        With `stop_on_oom`, an out-of-memory death ends the run (stats.oom) instead of backing off,
        so that the caller's batch-size search can decide what to try next.
        """
        stats = RunStats()
        if not self.pending:
            # Nothing to do (a finished job resumed, say): do not start an engine for it.
            first = next(source, None)
            if first is None:
                return stats
            self.pending.append(first)
        taken = 0
        exhausted = False
        busy_since: float | None = None
        while not stats.oom:
            if not any(not w.retired for w in self.workers):
                raise BatchrunError("no engine worker is left running")
            for w in self.workers:
                if w.retired:
                    continue
                if w.process is None:
                    self._start(w)
                if not w.ready:
                    continue
                if busy_since is None:
                    busy_since = time.monotonic()
                room = w.settings.window + max(4, w.settings.window // 2) - len(w.inflight)
                if limit is not None:
                    room = min(room, limit - taken)
                if room <= 0:
                    continue
                batch: list[Request] = []
                while len(batch) < room and self.pending:
                    batch.append(self.pending.popleft())
                while len(batch) < room and not exhausted:
                    try:
                        batch.append(next(source))
                    except StopIteration:
                        exhausted = True
                if batch:
                    taken += len(batch)
                    w.send(batch)
            inflight = sum(len(w.inflight) for w in self.workers)
            no_more = (exhausted or (limit is not None and taken >= limit)) and not self.pending
            if inflight == 0 and no_more:
                break
            self._wait(stats, stop_on_oom)
        if busy_since is not None:
            stats.seconds = time.monotonic() - busy_since
        return stats

    def _wait(self, stats: RunStats, stop_on_oom: bool) -> None:
        """Handle the messages that arrive within a short wait."""
        try:
            item = self.inbox.get(timeout=0.25)
        except queue.Empty:
            return
        records: list[dict[str, Any]] = []
        outcomes: list[Outcome] = []
        while True:
            index, generation, kind, payload = item
            w = self.workers[index]
            if generation == w.generation and w.process is not None:
                for outcome, request in w.handle(kind, payload):
                    attempt = self.state.attempts.get(outcome.custom_id, 0) + 1
                    rec = result_record(outcome, request.line, attempt)
                    rec["worker"] = index
                    self.state.record(rec)
                    records.append(rec)
                    outcomes.append(outcome)
                if kind == "ready":
                    self.on_ready(w)
                    self.reporter.event(
                        f"{w.label} ready (pid {w.pid}, batch size {w.settings.window}, "
                        f"started in {w.start_s:.1f}s)"
                    )
                if kind == "eof":
                    # Journal what the worker finished before it died, then deal with the death.
                    self._journal(records, outcomes, stats)
                    records, outcomes = [], []
                    self._on_death(w, stats, stop_on_oom)
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                break
        self._journal(records, outcomes, stats)

    def _journal(
        self, records: list[dict[str, Any]], outcomes: list[Outcome], stats: RunStats
    ) -> None:
        if not records:
            return
        self.journal.append(records)
        for o in outcomes:
            stats.outcomes += 1
            if o.ok:
                stats.succeeded += 1
            else:
                stats.failed += 1
            stats.prompt_tokens += o.prompt_tokens
            stats.completion_tokens += o.completion_tokens
        self.reporter.advance(outcomes)

    def on_ready(self, w: Worker) -> None:
        """Remember where a worker runs, for `status`."""
        self.worker_info[str(w.index)] = {
            **w.describe(),
            "label": w.label,
            "batch_size": w.settings.window,
            "start_s": round(w.start_s, 2),
        }

    # -- workers --------------------------------------------------------------------------------

    def _start(self, w: Worker) -> None:
        w.start(self.inbox)
        where = f"pid {w.pid}, " if w.pid else ""
        if w.env.get("BATCHRUN_CPU_AFFINITY"):
            where += f"CPU cores {w.env['BATCHRUN_CPU_AFFINITY']}, "
        self.reporter.event(
            f"{w.label} starting {w.settings.engine} engine ({where}batch size {w.settings.window})"
        )

    def _requeue(self, w: Worker) -> int:
        held = w.take_inflight()
        self.pending.extendleft(reversed(held))
        return len(held)

    def _on_death(self, w: Worker, stats: RunStats, stop_on_oom: bool) -> None:
        death = w.death
        assert death is not None
        progressed = w.results > 0
        requeued = self._requeue(w)
        w.stop(timeout=5)
        back = f"; {requeued} in-flight requests go back to pending" if requeued else ""
        if death.oom:
            size = w.settings.window
            self.reporter.event(f"{w.label} ran out of memory at batch size {size}{back}")
            if stop_on_oom:
                stats.oom = True
                return
            smaller = back_off(size)
            if smaller is None:
                self._give_up(w, f"out of memory even at batch size 1 ({death.message})")
                return
            self.reporter.event(f"{w.label}: backing off, batch size {size} -> {smaller}")
            w.settings.window = smaller
            w.settings.max_num_seqs = smaller
            return
        if death.during_start:
            self._give_up(w, f"the engine failed to start: {death.message}")
            return
        w.deaths_without_progress = 0 if progressed else w.deaths_without_progress + 1
        self.reporter.event(f"{w.label} died: {death.message}{back}; starting a fresh one")
        if w.deaths_without_progress >= MAX_DEATHS_WITHOUT_PROGRESS:
            self._give_up(
                w,
                f"the engine worker died {MAX_DEATHS_WITHOUT_PROGRESS} times in a row without "
                f"finishing a request (last: {death.message})",
            )

    def _give_up(self, w: Worker, reason: str) -> None:
        w.retired = True
        if any(not other.retired for other in self.workers):
            self.reporter.event(f"{w.label} retired: {reason}; the other workers go on")
            return
        raise BatchrunError(f"{reason}. Everything finished so far is saved")

    def close(self) -> None:
        """Stop every worker (the requests they held stay pending in the journal's eyes)."""
        for w in self.workers:
            if w.process is not None:
                self._requeue(w)
                w.stop(timeout=10)
