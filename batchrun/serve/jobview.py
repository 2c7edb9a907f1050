"""The one place the server reads or stamps a job's manifest (its keys are known only here).

`batchrun status --job-dir` on a batch's directory shows what the manifest says here: the batch
id as the job's id, running (with the server's pid) while the server runs it, then the final
status (`cancelled`, `expired` and `failed` as the API says them) and counts. `claim_job` marks
the job as this server's batch (the manifest's `served_by`, read by the core in job/served.py):
such a job runs here, never with `resume` or `retry-failed`.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from batchrun.errors import BatchrunError
from batchrun.job.manifest import Manifest, Run, save_manifest
from batchrun.job.paths import JobPaths
from batchrun.job.run_clock import settle_runs
from batchrun.job.served import ENDED, mark_served
from batchrun.job.state import JobState

# When this process started (near enough): a run that began before it is another server's.
_STARTED_AT = time.time()


@dataclass(frozen=True)
class JobFacts:
    """What the server needs of a job's manifest."""

    requests: int  # valid requests
    invalid: int  # invalid input lines
    endpoint: str | None
    input_path: Path
    max_attempts: int


def job_facts(manifest: Manifest) -> JobFacts:
    """The facts of a job, read from its manifest."""
    return JobFacts(
        requests=manifest.requests,
        invalid=manifest.invalid,
        endpoint=manifest.endpoint,
        input_path=Path(manifest.input_path),
        max_attempts=manifest.max_attempts,
    )


@dataclass(frozen=True)
class Price:
    """What a server's run of a batch costs an hour: --gpu-hour-cost, and the GPUs (or 1, the
    machine) its engines hold, None until its first engine pool is made (job/cost.py)."""

    usd_per_hour: float | None = None
    units: int | None = None


def stamp_job(
    paths: JobPaths,
    manifest: Manifest,
    status: str,
    state: JobState,
    ray: str | None = None,
    price: Price = Price(),
) -> None:
    """Write the job's status and counts into its manifest, as `run_job` does for a CLI run.

    `running` opens a run (this server's pid, which `status` reads, and its --ray address if it
    runs on Ray), after settling the runs a killed server left open (each ends when its clock
    last saw it, serve/clocks.py); any other status closes this server's run.
    """
    requests = manifest.requests
    now = time.time()
    if status == "running":
        settle_runs(paths, manifest)
        manifest.runs.append(
            Run(
                mode="serve",
                started_at=now,
                pid=os.getpid(),
                ray=ray,
                usd_per_hour=price.usd_per_hour,
                units=price.units,
            )
        )
    elif manifest.runs and _ours(manifest.runs[-1]):
        run = manifest.runs[-1]
        run.ended_at, run.status, run.wall_s = now, status, round(now - run.started_at, 3)
    manifest.status = status
    manifest.counts = {
        "total": requests + state.invalid,
        "succeeded": state.succeeded,
        "failed": state.failed,
        "invalid": state.invalid,
        "pending": state.pending(requests),
    }
    manifest.tokens = {"prompt": state.prompt_tokens, "completion": state.completion_tokens}
    with contextlib.suppress(BatchrunError):  # a full disk must not stop the other batches
        save_manifest(paths, manifest)


def price_open_runs(jobs: Iterable[tuple[JobPaths, Manifest]], units: int) -> None:
    """Give this server's open runs of `jobs` that began before its first engine pool the GPUs
    its engines hold (saved at once: a kill -9 next keeps them)."""
    for paths, manifest in jobs:
        if manifest.runs and _ours(manifest.runs[-1]) and manifest.runs[-1].units is None:
            manifest.runs[-1].units = units
            with contextlib.suppress(BatchrunError):
                save_manifest(paths, manifest)


def _ours(run: Run) -> bool:
    """Whether `run` is open and this process's (a pid alone may be an earlier server's, in a
    container whose server is always the same pid)."""
    return run.ended_at is None and run.pid == os.getpid() and run.started_at >= _STARTED_AT


def claim_job(paths: JobPaths, manifest: Manifest, batch_id: str) -> None:
    """Make a batch's job this server's: named by the batch's id, so that `batchrun status` names
    it as the API does, and owned by the server's root (ROOT/batches/<batch id>), so that the
    command line's resume and retry-failed leave it to the server."""
    root = Path(os.path.abspath(paths.root)).parent.parent
    changed = mark_served(manifest, batch_id, root)
    if manifest.job_id != batch_id:
        manifest.job_id, changed = batch_id, True
    if changed:
        with contextlib.suppress(BatchrunError):  # a full disk: the next claim tries again
            save_manifest(paths, manifest)


__all__ = ["ENDED", "JobFacts", "claim_job", "job_facts", "stamp_job"]
