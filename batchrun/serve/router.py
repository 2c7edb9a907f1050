"""One engine pool shared by every batch: requests of several batches in flight at once, each
result journaled into its own batch's journal.

A batch's requests enter the pool with their custom_id prefixed by the batch's slot (digits) and
a separator, so that two batches may use the same custom_ids (the engine workers key what they
hold by custom_id); the prefix, split off at the first separator, is taken off before anything is
journaled, whatever the custom_id itself holds. The pool is the
job runner's Scheduler (back-off, poison isolation, restarts), given serve's result sink
(`BatchJournals`): each outcome is journaled into its batch's journal.

With several base models (`--model NAME=PATH`, repeated) a pool runs one model: a batch runs
model by model, as a submitted job does (run/model_routes.py): its passes for its first model (the
run pass, then the retries), then those for the next, each pass reading only the lines that
model answers. A batch's `kind` names its current model, so the runner switches the pool between
models as it switches between engine kinds (serve/kinds.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from batchrun.job.journal import JournalWriter
from batchrun.job.journal_records import ResultRecord
from batchrun.job.manifest import Manifest, load_manifest
from batchrun.job.paths import JobPaths
from batchrun.job.state import JobState, replay
from batchrun.job.summary import keep_summary
from batchrun.models.named import settings_for
from batchrun.openai.records import POOLING_ENDPOINTS, Outcome, Request
from batchrun.run.answer_cache import AnswerCache
from batchrun.run.dedup import Duplicates
from batchrun.run.options import RunOptions
from batchrun.run.parts import RunFigures
from batchrun.run.planner import plan
from batchrun.run.recording import counted_records
from batchrun.run.reporting import Reporter
from batchrun.run.scheduler import Scheduler
from batchrun.run.source import InputIndex, requests
from batchrun.run.tuning import cached_size, lower_size
from batchrun.serve.batches import QueueOrder
from batchrun.serve.jobview import JobFacts, job_facts
from batchrun.workers.devices import cache_device, search_ceiling
from batchrun.workers.plan import plan_workers

# Between a batch's slot and a request's custom_id inside the pool.
SEP = "\x00"


def engine_kind(endpoint: str | None) -> str:
    """Which engine a batch needs: embeddings, score and rerank run vLLM as a pooling model (one
    pool answers all three), the rest generate."""
    return "embed" if endpoint in POOLING_ENDPOINTS else "generate"


@dataclass
class ActiveJob:
    """A batch the server runs: its job, its journal open, and where its passes stand."""

    batch_id: str
    slot: str
    paths: JobPaths
    manifest: Manifest
    facts: JobFacts
    state: JobState
    # The queue's order: priority (high first), then creation (second, sequence), then id.
    order: QueueOrder
    deadline: float
    journal: JournalWriter
    locks: contextlib.ExitStack
    # Requests handed to the pool whose outcome has not come back.
    outstanding: int = 0
    # The pass being fed (None: the next one is chosen when needed) and its next request.
    source: Iterator[Request] | None = None
    ahead: Request | None = None
    passes: int = 0
    # Set once no pass has anything left to feed: the batch ends when `outstanding` is 0.
    drained: bool = False
    # Whether its batch is in_progress: set when its first request goes to the engines.
    started: bool = False
    # Why it stops early: "cancelled", "expired" or "failed" (then `error` says why).
    stop: str | None = None
    error: str | None = None
    # The pass fed is over but some of its requests are still out: the next waits for them.
    waiting: bool = False
    completed: int = 0
    failed: int = 0
    # What a fresh validation of this process found, for a cheap first pass (see run/source.py).
    index: InputIndex | None = None
    # The identical deterministic requests the dispatch plan holds back for the one that runs
    # (run/dedup.py); None with --order input.
    duplicates: Duplicates | None = None
    # With several models: the base models its lines name, in the server's order, and which
    # one its passes run now (empty: one model).
    models: tuple[str, ...] = ()
    model_at: int = 0

    @property
    def model(self) -> str | None:
        """The base model this batch's passes run on now (None: the server runs one model)."""
        return self.models[self.model_at] if self.models else None

    @property
    def kind(self) -> str:
        """The engine kind this batch needs now (with several models, on which model)."""
        kind = engine_kind(self.facts.endpoint)
        return f"{kind}:{self.model}" if self.models else kind

    def next_model(self) -> bool:
        """Move on to the next model's passes (all of this one's ran); False after the last."""
        if self.model_at + 1 >= len(self.models):
            return False
        self.model_at += 1
        self.passes = 0
        return True


def open_job(
    batch_id: str,
    slot: str,
    job_dir: Path,
    order: QueueOrder,
    deadline: float,
    locks: contextlib.ExitStack,
) -> ActiveJob:
    """Open a validated job for running: replay its journal, open it for appending."""
    paths = JobPaths(job_dir)
    manifest = load_manifest(paths)
    state = replay(paths, manifest)
    journal = JournalWriter(paths.journal).open()
    keep_summary(paths, manifest, journal)  # status reads it: O(1) in the journal
    locks.callback(journal.close)
    job = ActiveJob(
        batch_id=batch_id,
        slot=slot,
        paths=paths,
        manifest=manifest,
        facts=job_facts(manifest),
        state=state,
        order=order,
        deadline=deadline,
        journal=journal,
        locks=locks,
    )
    job.completed = state.succeeded
    job.failed = state.failed
    if manifest.order != "input":
        job.duplicates = Duplicates()
    return job


def next_pass(
    job: ActiveJob, model_of: Callable[[Request], str] | None = None
) -> Iterator[Request] | None:
    """The run pass first, then retry passes while retryable failures have attempts left;
    each in the dispatch plan's order, identical deterministic requests run once
    (run/planner.py, run/dedup.py). With several models (`model_of` names the base model that
    answers a request), only the lines of the job's current model."""
    if job.stop is not None:
        return None
    state, path, model = job.state, job.facts.input_path, job.model
    job.passes += 1

    def mine(want: Callable[[Request], bool]) -> Callable[[Request], bool]:
        if model_of is None or model is None:
            return want
        return lambda r: want(r) and model_of(r) == model

    if job.passes == 1:
        return plan(
            requests(path, mine(state.is_not_done), job.index),
            job.manifest.order,
            job.duplicates,
        )
    ids = set(state.retryable(job.facts.max_attempts))
    if not ids:
        return None
    return plan(
        requests(path, mine(lambda r: r.custom_id in ids), job.index),
        job.manifest.order,
        job.duplicates,
    )


def job_models(
    manifest: Manifest, names: list[str], base_of: Callable[[str], str]
) -> tuple[str, ...]:
    """The base models (of `names`, the server's, in its order) that a job's valid lines name,
    from the counts its validation kept (`base_of`: an adapter's base model)."""
    named = {base_of(name) for name in manifest.model_requests}
    return tuple(n for n in names if n in named) or tuple(names)


class BatchJournals:
    """The engine pool's result sink (run/recording.py): each outcome journaled into its batch's
    job at once, grouped by batch."""

    # Each batch holds back its own duplicates (ActiveJob.duplicates), answered here.
    duplicates: Duplicates | None = None

    def __init__(
        self,
        jobs: dict[str, ActiveJob],
        reporter: Reporter,
        on_results: Callable[[ActiveJob, Sequence[Outcome]], None] | None = None,
        record_model: Callable[[Request], str] | None = None,
    ) -> None:
        self.jobs = jobs
        self.reporter = reporter
        self.on_results = on_results
        # What a request's record names as its model (several models, or adapters: status
        # counts per model and adapter); None: records name none.
        self.record_model = record_model

    def record(
        self,
        pairs: Sequence[tuple[Outcome, Request]],
        index: int | None,
        records: list[ResultRecord],
        outcomes: list[Outcome],
    ) -> bool:
        """Journal each outcome into its batch's journal at once (grouped by batch; `index`
        None: answers from the cache, which no worker ran)."""
        now = round(time.time(), 3)
        groups: dict[str, list[tuple[Outcome, Request]]] = {}
        for outcome, request in pairs:
            slot, _, custom_id = request.custom_id.partition(SEP)
            outcome.custom_id = custom_id
            plain_request = Request(custom_id, request.line, request.url, request.body)
            groups.setdefault(slot, []).append((outcome, plain_request))
        for slot, group in groups.items():
            job = self.jobs.get(slot)
            if job is None:  # cannot happen: a job stays open while it has outstanding requests
                self.reporter.event(f"dropped {len(group)} results of an unknown batch slot {slot}")
                continue
            if job.stop == "cancelled":
                # Sent before the cancel, back after it: dropped, as OpenAI's cancel promises
                # (what was journaled before it stays in the output; nothing after it is added).
                job.outstanding -= len(group)
                continue
            # The requests out are the group's; the copies answered for the duplicates held back
            # (run/dedup.py) were never out, and go into the same journal append.
            out = len(group)
            if job.duplicates is not None and job.duplicates.held:
                # (Counted as copies by the state's fold: job/tally.py.)
                group += job.duplicates.answer(group)
            ok_before, failed_before = job.state.ok, job.state.failed
            done, recs, plain = counted_records(job.state, group, index, now, self.record_model)
            ok_added = job.state.ok - ok_before
            failed_added = job.state.failed - failed_before
            job.journal.append(recs, plain=plain)
            job.completed += ok_added
            job.failed += failed_added
            job.outstanding -= out
            records += recs
            outcomes += done
            if self.on_results is not None:
                self.on_results(job, done)
        return True

    def write(self, records: list[ResultRecord], plain: bool) -> bool:
        """Nothing left to journal: `record` journaled each batch's records already."""
        return True

    def attempts(self) -> Mapping[str, int]:
        """None counted here: each batch's attempts are its own job's."""
        return {}

    def whole(self, outcomes: Iterable[Outcome]) -> None:
        """Nothing to read back: serve's workers send their results whole (job/shards.py)."""


def build_pool(
    root: Path,
    options: RunOptions,
    endpoint: str | None,
    jobs: dict[str, ActiveJob],
    reporter: Reporter,
    on_results: Callable[[ActiveJob, Sequence[Outcome]], None],
    model: str | None = None,
    *,
    metrics: RunFigures | None = None,
    live: Callable[[], bool] | None = None,
    record_model: Callable[[Request], str] | None = None,
) -> Scheduler:
    """An engine pool for batches of `endpoint`'s kind (on the base model `model`, with several),
    as `run_job` sets up a job's workers: on Ray or local processes (their output in
    ROOT/logs), at the fixed, remembered or largest batch size (an out-of-memory death backs
    off, and the size cache remembers it)."""
    one = options.settings if model is None else settings_for(options.settings, model)
    settings = dataclasses.replace(one, endpoint=endpoint)
    worker_class, envs = plan_workers(
        settings, ray=options.ray, gpus=options.gpus, workers=options.workers, logs=root / "logs"
    )
    device = cache_device(settings.spec, envs)  # the workers' GPUs (or cpu)
    pool = Scheduler(
        settings,
        envs,
        BatchJournals(jobs, reporter, on_results, record_model),
        reporter,
        worker_class,
        job_dir=root,
        on_back_off=lambda size: lower_size(settings, device, size),
        # Answers reused across batches and jobs (--cache-dir).
        answers=(
            AnswerCache.open(options.cache_dir, settings) if options.cache_dir is not None else None
        ),
        metrics=metrics,
        live=live,
        model=model,
    )
    pool.resize(
        options.batch_size
        or cached_size(settings, device)
        or options.max_batch
        or search_ceiling(settings.spec, envs)
    )
    return pool
