"""Pending work -> engine workers -> journal, with no batch barriers.

Each worker is kept topped up with its window of requests plus as many again queued (bounded:
`held_at_most`); every outcome is journaled the moment it arrives. When a worker dies, a fresh
one starts and nothing finished is lost. What happens to the requests the dead worker held
depends on why it died:

- out of memory: they go back to the front of the pending queue (not counted as an attempt) and
  the fresh worker runs half the batch size;
- anything else: any of them may have killed it, so they are isolated (`poison.Isolator`): run
  again in halves, each half alone on a worker, until the one that kills a worker on its own is
  found and fails by itself (`engine_crash`) while every other request runs.

A job is given up on only when its workers cannot start, die holding nothing, or crash on request
after request with none finishing in between (the engine, not the input, is broken). That policy
lives in `run/restarts.py`. A worker that goes silent holding requests (a hung engine) or never
gets ready is killed and replaced by the watchdog's policy (`run/watchdog.py`).
Where each outcome goes is the sink's the scheduler is given (`run/recording.py`: a job's journal,
or serve's batches); metrics and the event log are parts it is given too, null ones when absent
(`run/parts.py`). Nothing is set on a scheduler once made: what changes per pass (a job of several
models: the model's answer cache) is given to `switch_model` and `run_lanes`.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
import queue
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from batchrun import stopping, timeline
from batchrun.config import EngineSettings
from batchrun.engines.vllm.model_defaults import sampling_defaults_line
from batchrun.errors import BatchrunError
from batchrun.job.journal_records import ResultRecord
from batchrun.openai.records import Outcome, Request
from batchrun.run import admission as admission_rule
from batchrun.run.admission import Admission, KvCache
from batchrun.run.answer_cache import AnswerCache
from batchrun.run.lanes import Lane, Lanes
from batchrun.run.memory import fewer_collections, return_large_blocks
from batchrun.run.parts import Events, NullEvents, NullFigures, RunFigures
from batchrun.run.planner import prompt_chars
from batchrun.run.poison import Isolator
from batchrun.run.recording import Recording, ResultSink
from batchrun.run.reporting import Reporter, RunStats
from batchrun.run.restarts import RestartPolicy, restart_reason, start_events
from batchrun.run.watchdog import HangPolicy, Watchdog
from batchrun.workers.messages import Eof, Inbox, Ready, Restart
from batchrun.workers.process import Worker

# What makes two workers' engines the same model (a worker switched to its own stays up).
_model_of = operator.attrgetter("model", "model_name", "model_commit", "lora_modules")
# Why a worker starts again when a job of several models moves on to the next (the event log's).
MODEL_SWITCH = "model_switch"

# Requests a worker holds beyond its window, queued in the worker for the moment one finishes:
# as many again (at most this many), so that a worker whose results the parent is still
# journaling always has work in hand. Isolating a poison request costs log2 of what it held.
MAX_PREFETCH = 2048
# ... and at most about this many prompt characters of them: 256 prefetched prompts of 250 KB
# each would hold 64 MB more in the parent (issue 28: a file of long prompts in bounded memory).
MAX_PREFETCH_CHARS = 16 * 2**20


def held_at_most(window: int, request_chars: int = 0) -> int:
    """The most requests a worker with this window holds at once: the window plus prefetch,
    fewer prefetched when requests are long (`request_chars`: a recent request's prompt)."""
    prefetch = min(MAX_PREFETCH, max(4, window))
    if request_chars > 0:
        prefetch = min(prefetch, max(4, MAX_PREFETCH_CHARS // request_chars))
    return window + prefetch


class Scheduler:
    """Feeds requests to one or more engine workers and hands what comes back to its sink."""

    def __init__(
        self,
        settings: EngineSettings,
        worker_envs: Sequence[dict[str, str]],
        sink: ResultSink,
        reporter: Reporter,
        worker_class: type[Worker] = Worker,
        *,
        job_dir: Path | str = ".",
        on_back_off: Callable[[int], None] | None = None,
        answers: AnswerCache | None = None,
        metrics: RunFigures | None = None,
        events: Events | None = None,
        live: Callable[[], bool] | None = None,
        model: str | None = None,
        started: tuple[Sequence[Worker], Inbox] | None = None,
    ) -> None:
        """`sink`: where outcomes go (run/recording.py); `job_dir`: the job's directory, for the
        commands a message suggests; `on_back_off`: told the new size after an out-of-memory
        back-off (the job and the size cache keep it); `answers`: answers reused across jobs
        (run/answer_cache.py, --cache-dir); `metrics`: told of every dispatch, result and
        restart, for /metrics (batchrun/metrics); `events`: the job's event log, for `report`;
        `live`: whether a live source that ran dry may fill again (serve's queue, below);
        `model`: the base model a worker's start names (serve's pools of several models);
        `started`: workers already started on `settings`, and the queue their messages arrive in
        (run/early_start.py: a job's engine starts while its input is validated), taken as the
        scheduler's own instead of new ones."""
        self.sink = sink
        self.reporter = reporter
        self.inbox: Inbox = queue.Queue() if started is None else started[1]
        self.workers = (
            [
                worker_class(index=i, settings=dataclasses.replace(settings), env=dict(env))
                for i, env in enumerate(worker_envs)
            ]
            if started is None
            else list(started[0])
        )
        self.pending: deque[Request] = deque()
        # A recent request's prompt characters (planner.prompt_chars), which bounds prefetch.
        self.request_chars = 0
        self.isolator = Isolator()
        self.worker_info: dict[str, dict[str, Any]] = {}
        # A live source (the server's queue of batches) runs dry and fills again: while this says
        # True, a short read from it is not its end, so the run goes on (engines stay loaded) and
        # new work is taken as it comes. None: the source ends when it first runs dry.
        self.live = live
        self.model = model
        self.metrics: RunFigures = metrics if metrics is not None else NullFigures()
        self.events: Events = events if events is not None else NullEvents()
        self.recording = Recording(sink, reporter, self.metrics, answers, self._finished)
        # Notices workers gone silent: hung mid-run, or never ready (run/watchdog.py).
        self.watchdog = Watchdog()
        # What happens to dead and silent workers (run/restarts.py, run/watchdog.py).
        self.restarts = RestartPolicy(
            self.workers,
            self.isolator,
            reporter,
            self.recording,
            self.pending_for,
            job_dir=job_dir,
            on_back_off=on_back_off,
            metrics=self.metrics,
            events=self.events,
        )
        self.hangs = HangPolicy(self.restarts, self.watchdog)
        # Worker starts so far, first starts included (serve counts its pools' restarts).
        self.starts = 0
        for w in self.workers:
            if w.process is not None:  # started before (`started`): its clocks run from then
                self.starts += 1
                self.watchdog.started(w, now=w.started_at)
        # Why a worker stopped without dying (by index), for the restart's reason in /metrics.
        self._stopped_for: dict[int, str] = {}
        self._defaults_said = False  # the model's sampling defaults, said once a run
        # The planner's admission (run/admission.py, on with BATCHRUN_KV_ADMISSION): a worker's
        # prefixes fit its KV cache. Made for a run's source once a worker reports its cache.
        self.kv_admission = admission_rule.enabled()
        self.admission: Admission | None = None
        self._no_kv_said = False
        # Several models at once (run/lanes.py); None: one lane, `pending` and the run's source.
        self.lanes: Lanes | None = None

    # -- sizing ---------------------------------------------------------------------------------

    @property
    def batch_size(self) -> int:
        """The window of the first live worker (all workers share one size unless one backed off);
        a flow-controlled engine's is the window it reports (engines/base.py FlowControlled)."""
        for w in self.workers:
            if not w.retired:
                return w.flow_window or w.settings.window
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
                self.events.write("batch_size", worker=w.index, batch_size=size)
                continue
            if w.process is not None:
                self.restarts.requeue(w)
                w.stop()
                self._stopped_for[w.index] = "resize"
            w.settings.max_num_seqs = size
            w.settings.window = size

    def switch_model(self, settings: EngineSettings, answers: AnswerCache | None) -> None:
        """Run what comes next on `settings`' model (several models in a job,
        run/model_routes.py), with its answer cache: each worker stops (it holds nothing between
        passes) and starts with it when next needed, keeping its batch size."""
        for w in self.workers:
            self.switch_worker(w, settings)
        self.admission = None
        self.recording.answers = answers

    def switch_worker(self, w: Worker, settings: EngineSettings) -> None:
        """Run what `w` takes next on `settings`' model: it stops (holding nothing) and starts
        with it when next needed, keeping its batch size; already on that model, it runs on."""
        if _model_of(w.settings) == _model_of(settings):
            return
        if w.process is not None:
            self.restarts.requeue(w)
            w.stop(timeout=10)
            self._stopped_for[w.index] = MODEL_SWITCH
        w.settings = dataclasses.replace(
            settings, window=w.settings.window, max_num_seqs=w.settings.max_num_seqs
        )

    def pending_for(self, w: Worker) -> deque[Request]:
        """Where the requests `w` held go back to: its lane's pending (run/lanes.py)."""
        return self.pending if self.lanes is None else self.lanes.of(w.index).pending

    def run_lanes(
        self,
        lanes: dict[str, Lane],
        lane_of: Callable[[Request], str],
        answers: AnswerCache | None = None,
    ) -> RunStats:
        """Run several models' lanes at once, each worker fed from its own (run/lanes.py);
        `lane_of`: the lane of a request (those now pending are put in theirs); `answers`: the
        answer cache of every lane's model (run/lanes.py RoutedAnswers), kept after."""
        self.recording.answers = answers
        for request in self.pending:
            lanes[lane_of(request)].pending.append(request)
        self.pending.clear()
        self.admission = None
        self.lanes = Lanes(lanes, lane_of)
        try:
            live = [w for w in self.workers if not w.retired]
            for index, name in self.lanes.start([w.index for w in live]):
                self.switch_worker(self.workers[index], self.lanes.settings_of(name))
            return self.run(iter(()))
        finally:
            self.lanes = None

    def prefix_cache(self) -> tuple[int, int]:
        """vLLM's prefix-cache counters over every worker process so far: prompt tokens looked
        up, and found cached."""
        workers = self.workers
        return sum(w.cache_queries for w in workers), sum(w.cache_hits for w in workers)

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
        return_large_blocks()  # long prompts' blocks given back when freed (run/memory.py)
        with fewer_collections():
            return self._run(source, limit, stop_on_oom)

    def _run(self, source: Iterator[Request], limit: int | None, stop_on_oom: bool) -> RunStats:
        stats = RunStats()
        lanes = self.lanes or Lanes.single(source, self.pending)
        if self.lanes is None and not self.pending:  # (lanes were counted: each has work)
            # Nothing to do (a finished job resumed, say): do not start an engine for it.
            if self.recording.answers is not None:
                # What the cache answers is journaled here, a window at a time.
                self.pending.extend(self.recording.take(source, 256, stats)[0])
                if not self.pending:
                    return stats
            else:
                first = next(source, None)
                if first is None:
                    return stats
                self.pending.append(first)
        # The first request's size bounds the first send's prefetch (then each batch's).
        if self.pending:
            self.request_chars = prompt_chars(self.pending[0])
        taken = 0
        busy_since: float | None = None
        while not stats.oom:
            if not any(not w.retired for w in self.workers):
                raise BatchrunError("no engine worker is left running")
            for w in self.workers:
                if w.retired:
                    if self.admission is not None:
                        self.admission.retire(w.index)
                    continue
                if self.lanes is not None and not w.inflight and w.isolating is None:
                    self._move_when_done(w)
                lane = lanes.of(w.index)
                if w.process is None:
                    if time.monotonic() < w.start_not_before:
                        continue  # waiting to start again after a start-up failure
                    self._start(w)
                if not w.ready:
                    continue
                if busy_since is None:
                    busy_since = time.monotonic()
                if self._isolating(w):
                    continue
                room = held_at_most(w.settings.window, self.request_chars) - len(w.inflight)
                if limit is not None:
                    room = min(room, limit - taken)
                if room <= 0:
                    continue
                batch: list[Request] = []
                pending = lane.pending
                while len(batch) < room and pending:
                    batch.append(pending.popleft())
                if len(batch) < room and not lane.exhausted:
                    want = room - len(batch)
                    admission = self._admission_for(lane.source, w)
                    if admission is not None:
                        kv = KvCache(*w.kv_cache) if w.kv_cache is not None else None
                        got = admission.take(w.index, want, kv, w.settings.window)
                        lane.exhausted = admission.exhausted
                    else:
                        got, short = self.recording.take(lane.source, want, stats)
                        lane.exhausted = short and not (self.live is not None and self.live())
                    lane.left -= len(got)
                    batch += got
                if batch and self.admission is None:  # admission bounds its own batches
                    batch = self._bounded(batch, w.settings.window, len(w.inflight), pending)
                if batch:
                    taken += len(batch)
                    w.send(batch)
                    self.metrics.dispatched(batch)
            inflight = sum(len(w.inflight) for w in self.workers)
            # At its limit a run ends even with requests pending: those a worker held when it
            # ran out of memory went back there, for the next run (the search's next probe).
            no_more = (
                (limit is not None and taken >= limit) or lanes.done()
            ) and not self.isolator.groups
            if inflight == 0 and no_more:
                break
            self._wait(stats, stop_on_oom)
            self.hangs.watch(stats, stop_on_oom)
        if busy_since is not None:
            stats.seconds = time.monotonic() - busy_since
        return stats

    def _bounded(
        self, batch: list[Request], window: int, inflight: int, pending: deque[Request]
    ) -> list[Request]:
        """`batch` less what would take the worker's prefetch past MAX_PREFETCH_CHARS (put back
        at the front of `pending`, in order), its prompts' size sampled from its ends."""
        self.request_chars = max(prompt_chars(batch[0]), prompt_chars(batch[-1]))
        room = held_at_most(window, self.request_chars) - inflight
        if len(batch) <= room:
            return batch
        pending.extendleft(reversed(batch[max(room, 0) :]))
        return batch[: max(room, 0)]

    def _move_when_done(self, w: Worker) -> None:
        """Move idle `w` to another lane when its own has nothing left to run (run/lanes.py):
        it stops, to start on that lane's model."""
        assert self.lanes is not None
        others = [x.index for x in self.workers if not x.retired and x is not w]
        target = self.lanes.move(w.index, others, self.isolator, w.settings.window)
        if target is not None:
            self.switch_worker(w, self.lanes.settings_of(target))
            self.reporter.event(f"{w.label} moving to model {target}")

    def _admission_for(self, source: Iterator[Request], w: Worker) -> Admission | None:
        """The admission over `source` (made when a worker first reports its KV cache), or None:
        requests go out in the plan's order (--order input, a live source, an engine that
        reports no KV cache: said once)."""
        if self.admission is not None and self.admission.source is source:
            return self.admission
        if not self.kv_admission or self.sink.duplicates is None or self.live is not None:
            return None  # --order input (no plan to keep to), or serve's live queue
        if w.kv_cache is None:
            if not self._no_kv_said:
                self._no_kv_said = True
                self.reporter.event(
                    f"{w.label}: the {w.settings.engine} engine reports no KV cache size; "
                    "requests go out in the plan's order with no prefix budget"
                )
            return None
        self.admission = Admission(source)
        return self.admission

    def _isolating(self, w: Worker) -> bool:
        """Whether `w` is (or now starts) running a group of suspects alone: then nothing else."""
        if w.isolating is not None:
            if w.inflight:
                return True
            w.isolating = None  # the group finished: its members are cleared
        if not self.isolator.groups:
            return False
        lanes = self.lanes or Lanes({}, None)  # one lane: every group is any worker's
        mine = functools.partial(lanes.owns, name=lanes.of_worker.get(w.index, ""))
        if not any(mine(g) for g in self.isolator.groups):
            return False
        if w.inflight:
            # Drain first: a death while suspects share the worker with others would tell nothing.
            return True
        group = self.isolator.take(mine)
        assert group is not None
        w.isolating = group
        w.send(group.requests)
        self.metrics.dispatched(group.requests)
        return True

    def _wait(self, stats: RunStats, stop_on_oom: bool) -> None:
        """Handle the messages that arrive within a short wait."""
        # Once per wait: a stop whose exception was lost on the way (batchrun/stopping.py).
        stopping.deliver_pending()
        try:
            item = self.inbox.get(timeout=0.25)
        except queue.Empty:
            return
        records: list[ResultRecord] = []
        outcomes: list[Outcome] = []
        plain = True
        while True:
            index, generation, message = item
            w = self.workers[index]
            if generation == w.generation and w.process is not None:
                self.watchdog.heard(w, message.kind)
                pairs = w.handle(message)
                if pairs:
                    self.metrics.results(pairs)
                    self.isolator.on_success(len(pairs))
                    plain = self.recording.records(pairs, index, records, outcomes) and plain
                if isinstance(message, Ready):
                    w.start_failures = 0
                    self.on_ready(w)
                    self.events.write(
                        "ready", worker=index, batch_size=w.settings.window, timeline=w.timeline
                    )
                    self.reporter.event(
                        f"{w.label} ready (pid {w.pid}, batch size {w.settings.window}, "
                        f"started in {w.start_s:.1f}s)"
                    )
                    if w.sampling_defaults and not self._defaults_said:
                        self._defaults_said = True
                        self.reporter.event(sampling_defaults_line(w.sampling_defaults))
                if isinstance(message, Eof):
                    # Journal what the worker finished before it died, then deal with the death.
                    self.recording.journal_records(records, outcomes, stats, plain)
                    records, outcomes, plain = [], [], True
                    crashed = self.restarts.on_death(w, stats, stop_on_oom)
                    if crashed:
                        self.metrics.results(crashed)
                    plain = self.recording.records(crashed, index, records, outcomes)
                    stats.crashed += len(crashed)
                if isinstance(message, Restart):
                    # Its engine cannot abort a timed-out request (workers/child.py): it holds
                    # a slot until it finishes, if ever; a fresh engine holds none.
                    self._stopped_for[w.index] = "request_timeout"
                    self.hangs.replace(w, message.reason)
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                break
        self.recording.journal_records(records, outcomes, stats, plain)

    def _finished(self, outcomes: list[Outcome]) -> None:
        """Journaled outcomes leave the admission's budget (run/admission.py)."""
        if self.admission is not None:
            self.admission.finished(outcomes)

    def on_ready(self, w: Worker) -> None:
        """Remember where a worker runs, for `status`."""
        self.worker_info[str(w.index)] = {
            **w.describe(),
            "label": w.label,
            "batch_size": w.settings.window,
            "start_s": round(w.start_s, 2),
            # The planner's KV budget (run/admission.py): tokens, and tokens a block.
            "kv_cache_tokens": w.kv_cache[0] if w.kv_cache is not None else None,
        }

    # -- workers --------------------------------------------------------------------------------

    def _start(self, w: Worker) -> None:
        self.starts += 1
        if w.generation > 0:
            reason = restart_reason(w, self._stopped_for)
            if reason != MODEL_SWITCH:  # not a restart of a failure
                self.metrics.restarted(reason)
            self.events.write("restart", worker=w.index, reason=reason)
        self._stopped_for.pop(w.index, None)
        w.start(self.inbox)
        self.watchdog.started(w)
        model = None if self.lanes is None else self.lanes.of(w.index).name
        for line in start_events(w, model):
            self.reporter.event(line)
        if self.model is not None:  # serve's pool of one of several models: which one this runs
            self.reporter.event(
                f"{w.label} runs model {w.settings.model_name} ({w.settings.model})"
            )

    def close(self, *, leave: bool = False) -> None:
        """Stop every worker (the requests they held stay pending in the journal's eyes);
        `leave`: without waiting for their processes' exit once they have said all (a run's
        very end: workers/process.py Worker.stop)."""
        timeline.mark("workers_stopping")
        for w in self.workers:
            if w.process is not None:
                self.restarts.requeue(w)
                w.stop(timeout=10, leave=leave)
