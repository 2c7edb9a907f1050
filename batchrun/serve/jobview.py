"""The one place the server reads or stamps a job's manifest (its keys are known only here).

`batchrun status --job-dir` on a batch's directory shows what the manifest says here: running
(with the server's pid) while the server runs it, then the final status and counts.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

from batchrun.errors import BatchrunError
from batchrun.job.manifest import Manifest, Run, save_manifest
from batchrun.job.paths import JobPaths
from batchrun.job.state import JobState


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


def stamp_job(
    paths: JobPaths, manifest: Manifest, status: str, state: JobState, ray: str | None = None
) -> None:
    """Write the job's status and counts into its manifest, as `run_job` does for a CLI run.

    `running` opens a run (this server's pid, which `status` reads, and its --ray address if it
    runs on Ray); any other status closes it.
    """
    requests = manifest.requests
    now = time.time()
    if status == "running":
        manifest.runs.append(Run(mode="serve", started_at=now, pid=os.getpid(), ray=ray))
    elif manifest.runs and manifest.runs[-1].ended_at is None:
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
