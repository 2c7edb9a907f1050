"""Ending a batch's job on the runner's side: stopped or expired jobs swept, a job with nothing
out settled, and a finished job closed and handed to the finisher (with its request counts and
its errors, as the API shows them)."""

from __future__ import annotations

import queue
import time
from pathlib import Path

from batchrun.errors import BatchrunError
from batchrun.run.scheduler import Scheduler
from batchrun.serve import lifecycle
from batchrun.serve.batches import BatchStore
from batchrun.serve.errors import without_paths
from batchrun.serve.files import FileStore
from batchrun.serve.ids import is_file_id
from batchrun.serve.jobview import ENDED, stamp_job
from batchrun.serve.router import ActiveJob

SWEEP_EVERY_S = 0.2


class JobEnding:
    """The runner's part that ends jobs (a base of `Runner`, which sets these attributes and
    calls these methods under its lock)."""

    root: Path
    files: FileStore
    batches: BatchStore
    active: dict[str, ActiveJob]
    tenants: dict[str, str | None]
    pool: Scheduler | None
    _last_sweep: float
    _to_finalize: queue.Queue[str | None]

    def _changed(self) -> None:
        raise NotImplementedError

    def _begin(self, job: ActiveJob) -> None:
        raise NotImplementedError

    def _sweep(self, force: bool = False) -> None:
        """Expire jobs past their window; end stopped jobs with nothing out (at most every
        SWEEP_EVERY_S unless forced)."""
        now = time.time()
        if not force and now - self._last_sweep < SWEEP_EVERY_S:
            return
        self._last_sweep = now
        for job in list(self.active.values()):
            if job.stop is None and now >= job.deadline:
                job.stop = "expired"
                self._changed()
            if job.stop is not None and job.outstanding == 0:
                self._finish(job)

    def _settle(self, job: ActiveJob) -> None:
        """`job` has nothing out: end it if it was stopped, else let its next pass be fed."""
        if job.stop is not None:
            self._finish(job)
        elif job.waiting:
            job.waiting = False
            self._changed()

    def _finish(self, job: ActiveJob) -> None:
        """Close a job with nothing out and hand it to the finisher."""
        if self.active.pop(job.slot, None) is None:
            return
        self.tenants.pop(job.slot, None)
        self._changed()
        final = job.stop or "completed"
        try:
            if final == "expired":
                lifecycle.expire_rest(job)
            pending = job.state.pending(job.facts.requests)
            if self.pool is not None and self.pool.worker_info:
                # Where the engines that answered it ran, and at what size (`batchrun status`).
                job.manifest.worker_info = dict(self.pool.worker_info)
                if self.pool.batch_size:
                    job.manifest.batch_size = self.pool.batch_size
                    job.manifest.batch_size_source = "server"
            stamp_job(job.paths, job.manifest, _job_status(final, pending), job.state)
        except BatchrunError as e:  # the journal cannot be written: the batch fails
            final, job.error = "failed", str(e)
        finally:
            job.locks.close()
        fields: dict[str, object] = {}
        if job.error is not None:
            error = self._error(job.batch_id, "batch_failed", job.error)
            fields["errors"] = {"object": "list", "data": [error]}
        if final == "completed" and not job.started:
            self._begin(job)  # it had nothing to run (its lines ended before): it ran, at once
        # A completed batch is finalizing from now on (a cancel answers it unchanged); any other
        # keeps its status until the finisher ends it (cancelled, if a cancel comes first).
        done = final == "completed" and self.batches.transition(
            job.batch_id,
            ("in_progress",),
            final=final,
            status="finalizing",
            finalizing_at=int(time.time()),
            **fields,
        )
        if not done:
            self.batches.transition(
                job.batch_id,
                ("validating", "in_progress", "cancelling"),
                final="cancelled" if final == "completed" else final,
                **fields,
            )
        self._to_finalize.put(job.batch_id)

    def _error(self, batch_id: str, code: str, message: str) -> dict[str, object]:
        """An `errors.data` entry of a batch. Its message reaches API clients, so it names no
        path of the server's: the batch's input (its copy, or the upload) by its file id, any
        other path under the root by its place there."""
        record = self.batches.get(batch_id)
        file_id = str(record.batch["input_file_id"]) if record is not None else None
        names: dict[Path, str] = {}
        if file_id is not None and is_file_id(file_id):
            names[self.batches.job_dir(batch_id) / lifecycle.INPUT_NAME] = file_id
            names[self.files.content(file_id)] = file_id
        text = without_paths(message, self.root, names)
        return {"code": code, "message": text, "line": None, "param": None}

    def _publish(self, job: ActiveJob) -> None:
        """The batch's moving request counts, for the API."""
        invalid = job.state.invalid
        self.batches.set_counts(
            job.batch_id, job.facts.requests + invalid, job.completed, job.failed + invalid
        )


def _job_status(final: str, pending: int) -> str:
    """The status a batch's job ends with: the batch's own when it ended early (so `batchrun
    export` writes what finished, as the API does), else as a CLI run's."""
    if final in ENDED:
        return final
    return "incomplete" if pending else "completed"
