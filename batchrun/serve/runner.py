"""The queue of batches: validated in turn, fed to one shared engine pool by priority then age,
stopped early when cancelled or past their window, and finalized.

Three threads: the validator (a batch's input into its job), the runner (the engine pool and the
feed, which alone touch a running job's state and journal), and the finisher (export and files).
A restart puts every batch that had not ended back on the validator's queue: a validated job
is simply opened again, and its journal says what is left to run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import queue
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

from batchrun.errors import BatchrunError
from batchrun.job.cost import gpu_units
from batchrun.job.manifest import Run
from batchrun.job.paths import JobPaths
from batchrun.job.run_clock import see
from batchrun.openai.records import Outcome, Request
from batchrun.run.model_routes import ModelRoute
from batchrun.run.options import RunOptions
from batchrun.run.scheduler import Scheduler
from batchrun.serve import lifecycle, unserved_models
from batchrun.serve.batches import CANCELLABLE, BatchRecord, BatchStore
from batchrun.serve.clocks import Clocks
from batchrun.serve.ending import JobEnding
from batchrun.serve.files import FileStore
from batchrun.serve.jobview import Price, price_open_runs, stamp_job
from batchrun.serve.kind_switch import KindSwitch
from batchrun.serve.kinds import kind_switch_after
from batchrun.serve.metrics import Metrics
from batchrun.serve.router import (
    SEP,
    ActiveJob,
    build_pool,
    job_models,
    next_pass,
    open_job,
)


class StopServing(Exception):
    """Raised inside the pool's run to end it at once: the server is shutting down."""


class _Log:
    """The pool's reporter: its events go to the server's log."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self.say = say

    def event(self, message: str) -> None:
        self.say(message.replace(SEP, ":"))

    def advance(self, outcomes: Sequence[Outcome]) -> None:
        """Counted by the runner's own callback."""


class Runner(JobEnding):
    """Runs every batch of a server root on one engine pool."""

    def __init__(
        self,
        root: Path,
        options: RunOptions,
        files: FileStore,
        batches: BatchStore,
        metrics: Metrics,
        say: Callable[[str], None],
        gpu_hour_cost: float | None = None,
    ) -> None:
        self.root, self.options, self.files, self.batches = root, options, files, batches
        # What each run of a batch costs an hour (--gpu-hour-cost; the GPUs once a pool is made).
        self.price = Price(gpu_hour_cost)
        self.metrics, self.say = metrics, say
        self.lock = threading.RLock()
        self._wake = threading.Condition(self.lock)
        self.active: dict[str, ActiveJob] = {}  # by slot
        self._slots = itertools.count()
        self._version = 0  # changes whenever which job to feed may change
        # By kind: each tenant's first job to feed at the best priority (cached per version),
        # and the turn that says whose request goes next (round-robin: fair across tenants).
        self._top: dict[str, tuple[int, list[ActiveJob]]] = {}
        self._turn = 0
        # The tenant each active job's batch belongs to, by slot (serve/tenants.py).
        self.tenants: dict[str, str | None] = {}
        self._stopping = False
        self._last_sweep = 0.0
        self.pool: Scheduler | None = None
        # Which base model answers each line (several models: run/model_routes.py).
        self.route = ModelRoute(options.settings)
        self._pool_kind: str | None = None
        # When the pool gives way to a batch of another kind (serve/kind_switch.py).
        self._switch = KindSwitch(kind_switch_after())
        self.restarts = 0
        self._to_validate: queue.Queue[str | None] = queue.Queue()
        self._to_finalize: queue.Queue[str | None] = queue.Queue()
        # Each running batch's run clock: a kill -9 keeps its run's time (serve/clocks.py).
        self.clocks = Clocks(self._open_runs)
        self._threads = [
            threading.Thread(target=self._loop, name="batchrun-runner", daemon=True),
            threading.Thread(target=self._validate_loop, name="batchrun-validator", daemon=True),
            threading.Thread(target=self._finalize_loop, name="batchrun-finisher", daemon=True),
        ]

    # -- the API's side -------------------------------------------------------------------------

    def start(self) -> None:
        """Take up every batch that had not ended (after a restart), then start the threads."""
        for record in sorted(self.batches.all(), key=BatchRecord.created):
            if record.status in ("completed", "failed", "expired", "cancelled"):
                continue
            if record.final is not None:
                self._to_finalize.put(record.id)
            else:
                self._to_validate.put(record.id)
        for t in self._threads:
            t.start()
        self.clocks.start()

    def submit(self, batch_id: str) -> None:
        """Queue a batch just created."""
        self._to_validate.put(batch_id)

    def cancel(self, batch_id: str) -> BatchRecord | None:
        """Stop a validating or running batch: nothing more of it is fed, what is in flight
        finishes, and it ends cancelled. Returns its record, or None when its status (as on
        disk) was another: it is left as it is.

        Under the runner's lock, which `_activate` and `_finish` hold when they move a batch on:
        whichever comes first, the other sees it."""
        with self.lock:
            now = int(time.time())
            record = self.batches.transition(
                batch_id, CANCELLABLE, status="cancelling", cancelling_at=now
            )
            if record is None:
                return None
            for job in self.active.values():
                if job.batch_id == batch_id and job.stop is None:
                    job.stop = "cancelled"
                    self._changed()
            return record

    def stop(self, timeout: float = 15.0) -> None:
        """Stop the threads (the pool's workers with them); what is in flight runs again later."""
        with self.lock:
            self._stopping = True
            self._wake.notify_all()
        self._to_validate.put(None)
        self._to_finalize.put(None)
        for t in self._threads:
            if t.is_alive():
                t.join(timeout)
        self.clocks.stop()
        with self.lock:
            # Each run closed as interrupted (its time kept), journals synced and locks let go:
            # the batches go on when the server starts again on this root.
            for job in list(self.active.values()):
                with contextlib.suppress(Exception):
                    stamp_job(job.paths, job.manifest, "interrupted", job.state)
                with contextlib.suppress(Exception):
                    job.locks.close()

    def _open_runs(self) -> list[tuple[JobPaths, Run]]:
        """This server's open run of each batch it runs (for their clocks)."""
        with self.lock:
            jobs = list(self.active.values())
        return [
            (j.paths, j.manifest.runs[-1])
            for j in jobs
            if j.manifest.runs and j.manifest.runs[-1].ended_at is None
        ]

    def gauges(self) -> dict[str, object]:
        """Queue depth, batches by status, requests by outcome (the sum of the batches'
        request_counts) and engine restarts, for /metrics (from the store's index: the cost
        does not grow with the number of batches)."""
        with self.lock:
            depth = sum(
                max(0, j.facts.requests - j.completed - j.failed) for j in self.active.values()
            )
            restarts = self.restarts + (self._pool_restarts(self.pool) if self.pool else 0)
        by_status, totals = self.batches.counts()
        requests = {"succeeded": totals["completed"], "failed": totals["failed"]}
        tenant_batches, tenant_totals = self.batches.tenant_counts()
        return {
            "queue_depth": depth,
            "batches": by_status,
            "engine_restarts": restarts,
            "requests": requests,
            "tenant_batches": tenant_batches,
            "tenant_requests": {
                (tenant, "succeeded" if k == "completed" else k): v
                for (tenant, k), v in tenant_totals.items()
                if k in ("completed", "failed")
            },
        }

    # -- validation and finalizing --------------------------------------------------------------

    def _validate_loop(self) -> None:
        while (batch_id := self._to_validate.get()) is not None:
            try:
                done = lifecycle.validate(self.batches, self.files, self.options, batch_id)
                if done is not None:
                    self._activate(batch_id, done)
            except BatchrunError as e:
                lifecycle.fail(
                    self.batches, batch_id, [self._error(batch_id, "invalid_input", str(e))]
                )
            except Exception as e:  # a bug: this batch fails, the server goes on
                self.say(f"validating {batch_id} failed:\n{traceback.format_exc()}")
                error = self._error(batch_id, "internal_error", repr(e))
                lifecycle.fail(self.batches, batch_id, [error])

    def _activate(self, batch_id: str, done: lifecycle.Validated) -> None:
        record = self.batches.get(batch_id)
        assert record is not None
        order = record.queue_order()
        slot = str(next(self._slots))
        job_dir = self.batches.job_dir(batch_id)
        try:
            job = open_job(
                batch_id, slot, job_dir, order, float(record.batch["expires_at"]), done.locks
            )
        except BaseException:
            done.locks.close()
            raise
        job.index = done.index
        self.tenants[slot] = record.owner
        if self.route.known is not None:  # several models: the batch runs model by model
            job.models = job_models(job.manifest, self.route.names, self.route.known.base_of)
        # Restarted with other models: its lines of models this server lacks end (unserved_models.py).
        unserved = unserved_models.unserved(job, self.options.settings)
        stamp_job(
            job.paths, job.manifest, "running", job.state, ray=self.options.ray, price=self.price
        )
        see(job.paths, job.manifest.runs[-1])  # its clock from the start: a kill keeps its time
        with self.lock:
            # Decided against the record as it is now (a cancel may have come since it was read).
            # It stays validating until its first request goes to the engines (`_begin`): a
            # batch waiting for its kind's engines, or behind batches of higher priority, shows
            # that it has not started (docs/serve-kinds.md).
            current = self.batches.get(batch_id)
            if current is None or current.status not in CANCELLABLE:
                job.stop = "cancelled"
            else:
                job.started = current.status == "in_progress"  # taken up after a restart
            if unserved is not None and job.stop is None:
                unserved.journal(job)
                self.say(unserved.line())
            now_on = self.pool.model if self.pool is not None else None
            if now_on in job.models:  # its lines of the model loaded now run first: one switch less
                at = job.models.index(now_on)
                job.models = job.models[at:] + job.models[:at]
            self.active[slot] = job
            self._publish(job)
            self._changed()

    def _finalize_loop(self) -> None:
        while (batch_id := self._to_finalize.get()) is not None:
            try:
                lifecycle.finalize(self.batches, self.files, batch_id)
            except Exception:  # left finalizing: the next start tries again
                self.say(f"finalizing {batch_id} failed:\n{traceback.format_exc()}")

    # -- the runner thread ----------------------------------------------------------------------

    def _loop(self) -> None:
        try:
            while True:
                with self.lock:
                    if self._stopping:
                        return
                    self._sweep(force=True)
                    top = self._wanted()
                    if top is None:
                        self._wake.wait(0.25)
                        continue
                kind, endpoint = top.kind, top.facts.endpoint
                try:
                    pool = self._pool(kind, endpoint, top.model)
                    pool.run(_Feed(self, kind))
                except StopServing:
                    return
                except Exception as e:  # the engine pool failed: so do the batches it ran
                    if not isinstance(e, BatchrunError):
                        self.say(f"the engine pool failed:\n{traceback.format_exc()}")
                    self._close_pool()
                    self._fail_kind(kind, str(e))
        finally:
            self._close_pool()

    def _pool(self, kind: str, endpoint: str | None, model: str | None) -> Scheduler:
        """The engine pool for `kind` (on `model`), made (its engines load on the first request)
        if need be."""
        if self.pool is not None and self._pool_kind == kind:
            return self.pool
        log = _Log(self.say)
        if model is not None and self.pool is not None:
            log.event(f"switching to model {model}")
        self._close_pool()
        named = self.route.known is not None or self.options.settings.lora_modules
        pool = build_pool(
            self.root,
            self.options,
            endpoint,
            self.active,
            log,
            self._on_results,
            model,
            metrics=self.metrics.run,  # latency, queue wait, restarts: /metrics
            live=lambda: self._live(kind),
            # Status counts per model and adapter.
            record_model=self.route.record_name if named else None,
        )
        self.metrics.watch(pool, self.active)
        self.pool, self._pool_kind = pool, kind
        if self.price.units is None:  # every pool holds the same GPUs: the first one says
            units = gpu_units([w.env for w in pool.workers])
            self.price = dataclasses.replace(self.price, units=units)
            price_open_runs([(j.paths, j.manifest) for j in self.active.values()], units)
        self._switch.new_pool()
        return pool

    @staticmethod
    def _pool_restarts(pool: Scheduler) -> int:
        return max(0, pool.starts - len(pool.workers))

    def _close_pool(self) -> None:
        if self.pool is not None:
            self.restarts += self._pool_restarts(self.pool)
            with contextlib.suppress(Exception):
                self.pool.close()
            self.pool, self._pool_kind = None, None

    def _fail_kind(self, kind: str, message: str) -> None:
        """The pool for `kind` failed: its batches end as failed (what finished is kept)."""
        with self.lock:
            for job in list(self.active.values()):
                if job.kind == kind:
                    job.stop, job.error, job.outstanding = "failed", message, 0
                    self._finish(job)

    def _live(self, kind: str) -> bool:
        """While the pool runs: go on unless the server stops, or the kind switch says the pool
        gives way to a batch of another kind (or, with several models, of another model) that
        comes first in the queue's order (serve/kind_switch.py)."""
        if self._stopping:
            raise StopServing
        with self.lock:
            self._sweep()
            return self._switch.keeps(
                kind, self._first_kind(), self._has_work(kind), time.monotonic()
            )

    def _first_kind(self) -> str | None:
        """The kind of the first job in the queue's order with requests to feed."""
        top = self._wanted()
        return top.kind if top is not None else None

    def yields(self, kind: str) -> bool:
        """Whether the pool of `kind` stops taking work, for a batch of another kind that came
        first and has waited long enough (the pool then finishes what it holds and switches)."""
        return self._switch.yields(kind, self._first_kind, time.monotonic())

    def _has_work(self, kind: str) -> bool:
        """Whether a batch of `kind` has requests left to feed (now, or in its next pass)."""
        return any(
            j.kind == kind and j.stop is None and not j.drained for j in self.active.values()
        )

    def _on_results(self, job: ActiveJob, outcomes: Sequence[Outcome]) -> None:
        self.metrics.count(outcomes)
        with self.lock:
            self._publish(job)
            if job.outstanding == 0:
                self._settle(job)

    def _begin(self, job: ActiveJob) -> None:
        """The batch's first request goes to the engines (or it ends having had none to send):
        validating -> in_progress, `in_progress_at` now (under the runner's lock, as a cancel;
        a batch taken up after a restart is in_progress already and keeps its time)."""
        job.started = True
        self.batches.transition(
            job.batch_id, ("validating",), status="in_progress", in_progress_at=int(time.time())
        )

    # -- which job to feed ----------------------------------------------------------------------

    def _changed(self) -> None:
        self._version += 1
        self._wake.notify_all()

    @staticmethod
    def _feedable(job: ActiveJob) -> bool:
        return job.stop is None and not job.drained and not job.waiting

    def _wanted(self) -> ActiveJob | None:
        """The first job in the queue's order with requests to feed."""
        jobs = [j for j in self.active.values() if self._feedable(j)]
        return min(jobs, key=lambda j: j.order) if jobs else None

    def top(self, kind: str) -> ActiveJob | None:
        """The next job of `kind` to feed a request of: of the batches at the best priority,
        each tenant's first in the queue's order, in turn (so one tenant's flood never starves
        another's batch); with one tenant, simply the first in the queue's order."""
        cached = self._top.get(kind)
        if cached is None or cached[0] != self._version:
            cached = (self._version, self._heads(kind))
            self._top[kind] = cached
        heads = cached[1]
        if len(heads) <= 1:
            return heads[0] if heads else None
        self._turn += 1
        return heads[self._turn % len(heads)]

    def _heads(self, kind: str) -> list[ActiveJob]:
        """Each tenant's first job of `kind` to feed, of those at the best priority."""
        jobs = sorted(
            (j for j in self.active.values() if j.kind == kind and self._feedable(j)),
            key=lambda j: j.order,
        )
        firsts: dict[str | None, ActiveJob] = {}
        for job in jobs:
            if job.order[0] != jobs[0].order[0]:
                break
            firsts.setdefault(self.tenants.get(job.slot), job)
        return list(firsts.values())

    def take(self, job: ActiveJob) -> Request | None:
        """The next request of `job` for the pool, or None when it has none to give now."""
        while True:
            if job.source is None:
                job.source = next_pass(job, self.route.name_of if self.route.known else None)
                if job.source is None and job.next_model():  # the next model's pool runs it
                    self._changed()
                    return None
                if job.source is None:  # nothing is left to run, and nothing is out
                    job.drained = True
                    self._changed()
                    self._finish(job)
                    return None
            try:
                request = next(job.source, None)
            except (BatchrunError, OSError) as e:  # its input went bad: this batch fails alone
                job.source, job.stop, job.error = None, "failed", str(e)
                self._changed()
                self._settle(job)
                return None
            if request is not None:
                job.outstanding += 1
                if not job.started:
                    self._begin(job)
                return Request(
                    f"{job.slot}{SEP}{request.custom_id}", request.line, request.url, request.body
                )
            job.source = None
            if job.outstanding > 0:  # the next pass (the retries) waits for this one's results
                job.waiting = True
                self._changed()
                return None


class _Feed:
    """The pool's source: requests of the jobs of one engine kind, the first in the queue's order
    first; it runs dry and fills again (the pool is `live`)."""

    def __init__(self, runner: Runner, kind: str) -> None:
        self.runner, self.kind = runner, kind

    def __iter__(self) -> _Feed:
        return self

    def __next__(self) -> Request:
        runner = self.runner
        with runner.lock:
            runner._sweep()
            while not runner._stopping and not runner.yields(self.kind):
                job = runner.top(self.kind)
                if job is None:
                    break
                request = runner.take(job)
                if request is not None:
                    return request
        raise StopIteration
