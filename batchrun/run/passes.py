"""The run of a job: its passes (the run, the retry passes), the batch size chosen for them,
every outcome journaled, and the manifest finished at the end."""

from __future__ import annotations

import contextlib
import itertools
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from batchrun import timeline
from batchrun.config import DEFAULT_MAX_CONCURRENCY, EngineSettings
from batchrun.console.progress import ProgressReporter
from batchrun.console.render import JobSummary
from batchrun.console.text import plural
from batchrun.engines.remote.flow import START_WINDOW
from batchrun.errors import BatchrunError
from batchrun.job.cost import gpu_units
from batchrun.job.events import EventLog
from batchrun.job.journal import JournalWriter
from batchrun.job.manifest import Manifest, Run, save_manifest
from batchrun.job.paths import JobPaths
from batchrun.job.run_clock import RunClock, settle_runs
from batchrun.job.shards import shards_dir
from batchrun.job.state import JobState, replay
from batchrun.job.summary import keep_summary
from batchrun.models.named import settings_for
from batchrun.openai.records import POOLING_ENDPOINTS, Request
from batchrun.run.answer_cache import AnswerCache
from batchrun.run.dedup import Duplicates
from batchrun.run.early_start import StartedWorkers, search_top
from batchrun.run.lanes import Lane, RoutedAnswers
from batchrun.run.model_routes import ModelRoute
from batchrun.run.options import RunMode, RunOptions
from batchrun.run.planner import plan
from batchrun.run.recording import JournalSink
from batchrun.run.scheduler import Scheduler
from batchrun.run.source import InputIndex, requests
from batchrun.run.tuning import cached_size, lower_size, remember_size, search_batch_size
from batchrun.workers.devices import cache_device
from batchrun.workers.plan import plan_workers
from batchrun.workers.process import Worker

if TYPE_CHECKING:
    from batchrun.metrics import RunMetrics

# How a run ended, before its manifest says whether the job is complete (_finish_manifest).
RunEnd = Literal["completed", "failed", "interrupted"]


def run_job(
    paths: JobPaths,
    manifest: Manifest,
    options: RunOptions,
    mode: RunMode,
    index: InputIndex | None = None,
    state: JobState | None = None,
    metrics: RunMetrics | None = None,
    started: StartedWorkers | None = None,
) -> JobSummary:
    """Run the passes a command calls for, journaling every outcome; update the manifest.

    Each pass reads the input again: cheaply with an `index` a validating pass of this process
    made ready; an index not ready yet is recorded by the first pass, for the retry passes.
    `state`: the journal replayed by the caller under the job's lock (else it is replayed here).
    `metrics`: told of every dispatch and result, for /metrics (batchrun/metrics).
    `started`: workers started while the input was validated (run/early_start.py), the run's
    own from here on (stopped by it, when they do not run what it needs).
    """
    began = time.monotonic()
    settings = options.settings
    if started is not None and not started.fits(settings):
        started.stop()  # (its first valid line's endpoint is not the one validation found)
        started = None
    try:
        # Of the input as it is now: after a forced resume, only the requests still in the file.
        state = replay(paths, manifest) if state is None else state
        worker_class, envs = _workers_of(paths, options, started)
    except BaseException:
        if started is not None:
            started.stop()
        raise
    # Cached batch sizes are the workers' devices' (their GPUs' model, memory, MIG profile).
    device = cache_device(settings.spec, envs)
    failed_ids = state.failed_ids() if mode == "retry" else set()
    reporter = ProgressReporter(
        total=len(failed_ids) if mode == "retry" else manifest.requests,
        initial=0 if mode == "retry" else state.done,
        desc="retry" if mode == "retry" else "requests",
        enabled=options.progress,
    )
    run_info = _open_run(paths, manifest, mode, metrics, envs)
    clock = RunClock(paths, run_info).start()
    before = _Counts.of(state)
    duplicates = Duplicates() if options.order == "auto" else None

    def planned(source: Iterator[Request]) -> Iterator[Request]:
        return plan(source, options.order, duplicates)

    scheduler: Scheduler | None = None
    status: RunEnd = "failed"
    events = EventLog(paths.root)
    timeline.mark("run_start")
    try:
        with JournalWriter(paths.journal) as journal:
            keep_summary(paths, manifest, journal)  # status reads it: O(1) in the journal
            route = ModelRoute(settings, options.cache_dir)
            # Several models or adapters: each record names its model (status counts per model).
            named = route.known is not None or settings.lora_modules
            sink = JournalSink(journal, state, duplicates, route.record_name if named else None)
            scheduler = _new_scheduler(
                paths, manifest, options, (worker_class, envs, device), sink, reporter,
                metrics=metrics, events=events, started=started, watched=(state, mode),
            )  # fmt: skip
            try:
                passes = _Passes(manifest, options, paths, state, reporter, device, envs)
                passes.run(scheduler, route, mode, index, planned, failed_ids)
            finally:
                # The command ends here: the workers' exit (the kernel freeing an engine's
                # memory) is not waited for once they have said all.
                scheduler.close(leave=True)
                sink.close()  # (a Python caller runs job after job in one process)
                timeline.mark("workers_stopped")
        timeline.mark("journal_closed")
        status = "completed"
    except KeyboardInterrupt:
        status = "interrupted"
        raise
    finally:
        reporter.close()
        if scheduler is None and started is not None:
            started.stop()  # the run ended before it took them over
        if scheduler is not None:
            _keep_from_scheduler(manifest, run_info, settings, scheduler, metrics)
        run_info.ray = options.ray
        run_info.deduplicated = state.deduplicated - before.deduplicated
        clock.stop()
        _finish_manifest(paths, manifest, state, status, run_info, began)
        timeline.mark("manifest_saved")
        # The parent's moments of this run, with each worker's start (its "ready" event).
        events.write("timeline", marks=timeline.marks())
        if options.ray:
            from batchrun.workers import ray as ray_backend

            ray_backend.shutdown()
    return before.summary(paths, manifest, state, run_info, time.monotonic() - began)


def _workers_of(
    paths: JobPaths, options: RunOptions, started: StartedWorkers | None
) -> tuple[type[Worker], list[dict[str, str]]]:
    """The run's kind of worker and each worker's environment: the started workers', or planned."""
    if started is not None:
        return started.worker_class, started.envs
    return plan_workers(
        options.settings,
        ray=options.ray,
        gpus=options.gpus,
        workers=options.workers,
        logs=paths.logs,
        shards=shards_dir(paths.root),
    )


def _open_run(
    paths: JobPaths,
    manifest: Manifest,
    mode: RunMode,
    metrics: RunMetrics | None,
    envs: Sequence[Mapping[str, str]],
) -> Run:
    """Mark the job running and add this run to the manifest (saved), a killed run's time settled."""
    manifest.status = "running"
    settle_runs(paths, manifest)  # a killed run's time, kept by its clock
    rate = metrics.cost.usd_per_hour if metrics is not None and metrics.cost else None
    run_info = Run(
        mode=mode,
        started_at=time.time(),
        pid=os.getpid(),
        usd_per_hour=rate,
        units=gpu_units(envs),
    )
    manifest.runs.append(run_info)
    save_manifest(paths, manifest)
    return run_info


def _new_scheduler(
    paths: JobPaths,
    manifest: Manifest,
    options: RunOptions,
    workers: tuple[type[Worker], Sequence[dict[str, str]], str],
    sink: JournalSink,
    reporter: ProgressReporter,
    *,
    metrics: RunMetrics | None,
    events: EventLog,
    started: StartedWorkers | None,
    watched: tuple[JobState, RunMode],
) -> Scheduler:
    """The run's scheduler: `workers` (their class, environments and device) fed from the job,
    every outcome to `sink`; the started workers taken over, if any; `metrics` fed from it
    (`watched`: the job's state and the run's mode, for them)."""
    worker_class, envs, device = workers
    settings = options.settings
    scheduler = Scheduler(
        settings,
        envs,
        sink,
        reporter,
        worker_class,
        job_dir=paths.root,
        on_back_off=_keep_backed_off_size(paths, manifest, settings, device),
        answers=(
            AnswerCache.open(options.cache_dir, settings) if options.cache_dir is not None else None
        ),
        metrics=metrics,
        events=events,
        started=(started.workers, started.inbox) if started is not None else None,
    )
    if metrics is not None:
        from batchrun.metrics.run import watch_run

        state, mode = watched
        watch_run(
            metrics, scheduler, reporter, envs, options.max_attempts, state, mode,
            job=(paths, manifest),
        )  # fmt: skip
    return scheduler


def _keep_from_scheduler(
    manifest: Manifest,
    run_info: Run,
    settings: EngineSettings,
    scheduler: Scheduler,
    metrics: RunMetrics | None,
) -> None:
    """What the run's scheduler leaves the job: its metrics ended, where its workers ran, the
    window a flow-controlled engine settled on, the prefix-cache counters."""
    if metrics is not None:
        from batchrun.metrics.run import end_run

        end_run(metrics, scheduler)
    manifest.worker_info = scheduler.worker_info
    if settings.spec.flow_control and scheduler.batch_size:
        # The window the engine settled on is the job's batch size (engines/remote/).
        manifest.batch_size = scheduler.batch_size
        manifest.batch_size_source = "flow control"
    queries, hits = scheduler.prefix_cache()
    _count_cache(manifest, run_info, queries, hits)


@dataclass(frozen=True)
class _Counts:
    """The job's counters as a run began, so that its summary says what this run added."""

    outcomes: int
    engine_attempts: int
    completion_tokens: int
    engine_completion_tokens: int
    deduplicated: int
    cache_hits: int

    @classmethod
    def of(cls, state: JobState) -> _Counts:
        """The counters of `state` now."""
        return cls(
            outcomes=state.attempts.total(),
            engine_attempts=state.engine_attempts,
            completion_tokens=state.completion_tokens,
            engine_completion_tokens=state.engine_completion_tokens,
            deduplicated=state.deduplicated,
            cache_hits=state.cache_hits,
        )

    def summary(
        self, paths: JobPaths, manifest: Manifest, state: JobState, run_info: Run, wall_s: float
    ) -> JobSummary:
        """What the job is after the run, with what the run added since these counts."""
        cache = run_info.prefix_cache or {}
        return JobSummary(
            job_dir=paths.root,
            manifest=manifest,
            state=state,
            wall_s=wall_s,
            run_completion_tokens=state.completion_tokens - self.completion_tokens,
            run_outcomes=state.attempts.total() - self.outcomes,
            run_cache_queries=cache.get("queries", 0),
            run_cache_hits=cache.get("hits", 0),
            run_engine_attempts=state.engine_attempts - self.engine_attempts,
            run_engine_tokens=state.engine_completion_tokens - self.engine_completion_tokens,
        )


@dataclass
class _Passes:
    """What the passes of a run share: the job, its options, where its outcomes are counted."""

    manifest: Manifest
    options: RunOptions
    paths: JobPaths
    state: JobState
    reporter: ProgressReporter
    device: str
    envs: Sequence[Mapping[str, str]]
    sized: bool = False

    def run(
        self,
        scheduler: Scheduler,
        route: ModelRoute,
        mode: RunMode,
        index: InputIndex | None,
        planned: Callable[[Iterator[Request]], Iterator[Request]],
        failed_ids: set[str],
    ) -> None:
        """The passes of `mode`, model by model (one model: one pass, run/model_routes.py): the
        run and its retry passes, or retry-failed's pass."""
        input_path = Path(self.manifest.input_path)
        if mode in ("submit", "resume") and self._run_lanes(scheduler, route, index, planned):
            return
        for name in route.names:
            if mode == "retry":
                ids = route.ids_of(name, failed_ids, input_path, index)
                if not ids:  # nothing to size or start an engine for
                    continue
                route.use(scheduler, name)
                self.reporter.event(f"retrying {plural(len(ids), 'failed request')}")
                self._size(scheduler, iter(()))
                scheduler.run(planned(_requests_in(input_path, ids, index)))
                continue
            want = route.only(name, self.state.is_not_done)
            source = _nonempty(planned(requests(input_path, want, index)))
            if source is None:
                continue
            route.use(scheduler, name)
            self._size(scheduler, source, search=mode == "tune")
            if mode == "tune":
                return
            scheduler.run(source)
            self._retries(scheduler, route, name, index, planned)

    def _retries(
        self,
        scheduler: Scheduler,
        route: ModelRoute,
        name: str,
        index: InputIndex | None,
        planned: Callable[[Iterator[Request]], Iterator[Request]],
    ) -> None:
        """Model `name`'s retry passes (on that model, once there is one to run)."""
        input_path = Path(self.manifest.input_path)

        def mine(ids: set[str]) -> set[str]:
            found = route.ids_of(name, ids, input_path, index)
            if found:
                route.use(scheduler, name)
            return found

        _retry_passes(
            scheduler,
            self.state,
            input_path,
            self.options.max_attempts,
            self.reporter,
            lambda ids: planned(_requests_in(input_path, ids, index)),
            mine,
        )

    def _run_lanes(
        self,
        scheduler: Scheduler,
        route: ModelRoute,
        index: InputIndex | None,
        planned: Callable[[Iterator[Request]], Iterator[Request]],
    ) -> bool:
        """Run several models at once when there are several workers (run/lanes.py), then each
        model's retry passes; False (nothing run): one model or one worker, run model by model."""
        live = [w for w in scheduler.workers if not w.retired]
        if route.known is None or len(live) < 2:
            return False
        input_path = Path(self.manifest.input_path)
        counts = route.counts(self.state.is_not_done, input_path, index)
        names = [n for n in route.names if counts[n]]
        if len(names) < 2:
            return False
        settings = {n: settings_for(self.options.settings, n) for n in names}

        def lane(n: str) -> Lane:
            source = planned(requests(input_path, route.only(n, self.state.is_not_done), index))
            return Lane(n, source, settings[n], left=counts[n])

        lanes = {n: lane(n) for n in names}
        largest = max(names, key=lambda n: counts[n])
        route.use(scheduler, largest)  # the batch size is chosen on the largest model's lines
        self._size(scheduler, lanes[largest].source)
        self.reporter.event(
            f"running {len(names)} models at once on {plural(len(live), 'worker')}: "
            + ", ".join(f"{n} ({plural(counts[n], 'request')})" for n in names)
        )
        answers = None
        if self.options.cache_dir is not None:
            caches = {n: AnswerCache.open(self.options.cache_dir, settings[n]) for n in names}
            answers = RoutedAnswers(caches, route.name_of)
        scheduler.run_lanes(lanes, route.name_of, answers)
        route.current = None  # the workers run one model each: the next use() switches them all
        for name in names:
            self._retries(scheduler, route, name, index, planned)
        return True

    def _size(
        self, scheduler: Scheduler, source: Iterator[Request], *, search: bool = False
    ) -> None:
        """Choose the batch size before the first pass (the passes after it keep it)."""
        if self.sized:
            return
        self.sized = True
        _choose_size(
            scheduler,
            self.manifest,
            self.options,
            self.paths,
            source,
            self.reporter,
            search=search,
            device=self.device,
            envs=self.envs,
        )


def _requests_in(input_path: Path, ids: set[str], index: InputIndex | None) -> Iterator[Request]:
    return requests(input_path, lambda r: r.custom_id in ids, index)


def _nonempty(source: Iterator[Request]) -> Iterator[Request] | None:
    """`source` as it was, or None when it is empty (nothing left to size or run)."""
    first = next(source, None)
    return None if first is None else itertools.chain([first], source)


def _keep_backed_off_size(
    paths: JobPaths, manifest: Manifest, settings: EngineSettings, device: str
) -> Callable[[int], None]:
    """What to do when a worker backs off after running out of memory: the job records the size
    now running (status shows it, resume starts there), and the size cache for this set-up comes
    down to it, so that the next job does not pay the same restarts again."""

    def backed_off(size: int) -> None:
        manifest.batch_size, manifest.batch_size_source = size, "out-of-memory back-off"
        save_manifest(paths, manifest)
        lower_size(settings, device, size)

    return backed_off


def _choose_size(
    scheduler: Scheduler,
    manifest: Manifest,
    options: RunOptions,
    paths: JobPaths,
    source: Iterator[Request],
    reporter: ProgressReporter,
    *,
    search: bool = False,
    device: str,
    envs: Sequence[Mapping[str, str]] = (),
) -> None:
    """Use the job's batch size, a fixed one, a cached one, or search for one on `source`
    (`device`: the workers', as the size cache keys it)."""
    settings = options.settings
    if settings.spec.flow_control:  # the engine finds its window itself (engines/remote/)
        cap = settings.max_concurrency or DEFAULT_MAX_CONCURRENCY
        reporter.event(f"flow control: at most {cap} requests in flight (--max-concurrency)")
        scheduler.resize(cap)
        if not manifest.batch_size:  # what status shows until the run ends with the settled one
            manifest.batch_size, manifest.batch_size_source = min(START_WINDOW, cap), "flow control"
            save_manifest(paths, manifest)
        return
    # `search` (from `tune`) measures afresh, whatever an earlier job found.
    if not search and manifest.batch_size:
        size = manifest.batch_size
        how = manifest.batch_size_source or "job"
        reporter.event(f"batch size {size} ({how})")
        scheduler.resize(size)
        return
    if not search and (size_cached := cached_size(settings, device)) is not None:
        reporter.event(f"batch size {size_cached} (found by an earlier job on this set-up)")
        scheduler.resize(size_cached)
        manifest.batch_size, manifest.batch_size_source = size_cached, "cache"
        save_manifest(paths, manifest)
        return
    top = search_top(options, settings, envs)
    reporter.event(
        f"searching for the batch size between {options.min_batch} and {top} "
        "(the probes run this job's own requests)"
    )
    pooling = settings.endpoint in POOLING_ENDPOINTS
    result = search_batch_size(scheduler, source, reporter, options.min_batch, top, pooling)
    reporter.event(f"batch size {result.size} chosen")
    manifest.batch_size, manifest.batch_size_source = result.size, "search"
    manifest.probes = [p.to_dict() for p in result.probes]
    save_manifest(paths, manifest)
    # A search cut short by a small job measured too little to teach the next job anything.
    if any(p.ok and p.requests >= 2 * p.size for p in result.probes):
        remember_size(settings, device, result.size)


def _retry_passes(
    scheduler: Scheduler,
    state: JobState,
    input_path: Path,
    max_attempts: int,
    reporter: ProgressReporter,
    source: Callable[[set[str]], Iterator[Request]],
    only: Callable[[set[str]], set[str]] | None = None,
) -> None:
    """Re-run retryable failures, a whole pass at a time, until `max_attempts` attempts in all
    (`only`: those of them the pass's model answers)."""
    while True:
        retryable = state.retryable(max_attempts)
        ids = set(retryable)
        if ids and only is not None:
            ids = only(ids)
        if not ids:
            return
        attempt = min(retryable[c] for c in ids) + 1
        reporter.event(
            f"retry pass (attempt {attempt} of {max_attempts}): {plural(len(ids), 'failed request')}"
        )
        reporter.bar.total += len(ids)
        scheduler.run(source(ids))


def _count_cache(manifest: Manifest, run_info: Run, queries: int, hits: int) -> None:
    """Add a run's prefix-cache counters to the run and to the job's sums (an engine without a
    prefix cache, such as echo, counts nothing: nothing is recorded)."""
    if not queries:
        return
    run_info.prefix_cache = {"queries": queries, "hits": hits}
    total = manifest.prefix_cache
    total["queries"] = total.get("queries", 0) + queries
    total["hits"] = total.get("hits", 0) + hits


def _finish_manifest(
    paths: JobPaths,
    manifest: Manifest,
    state: JobState,
    status: RunEnd,
    run_info: Run,
    started: float,
) -> None:
    # "completed" only when every valid request has a finished attempt.
    ended = "incomplete" if status == "completed" and state.pending(manifest.requests) else status
    manifest.status = ended
    manifest.counts = {
        "total": manifest.requests + state.invalid,
        "succeeded": state.succeeded,
        "failed": state.failed,
        "invalid": state.invalid,
        "pending": state.pending(manifest.requests),
    }
    manifest.tokens = {"prompt": state.prompt_tokens, "completion": state.completion_tokens}
    run_info.ended_at = time.time()
    run_info.wall_s = round(time.monotonic() - started, 3)
    run_info.status = ended
    with contextlib.suppress(BatchrunError):
        save_manifest(paths, manifest)
