"""The one place the server reads or stamps a job's manifest (its keys are known only here).

`batchrun status --job-dir` on a batch's directory shows what the manifest says here: the batch
id as the job's id, running (with the server's pid) while the server runs it, then the final
status (`cancelled`, `expired` and `failed` as the API says them) and counts. The CLI's job
commands ask `served_batch` whether a job directory is a batch of a server's: such a job runs
there, never with `resume` or `retry-failed`.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import time
from dataclasses import dataclass
from pathlib import Path

from batchrun.errors import BatchrunError
from batchrun.job.manifest import Manifest, Run, save_manifest
from batchrun.job.paths import JobPaths
from batchrun.job.state import JobState
from batchrun.serve.batches import RECORD_NAME
from batchrun.serve.ids import is_batch_id

# The job statuses of a batch that ended before all its requests ran: what finished is its result.
ENDED = frozenset({"cancelled", "expired", "failed"})


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


def claim_job(paths: JobPaths, manifest: Manifest, batch_id: str) -> None:
    """Give a batch's job the batch's id, so that `batchrun status` names it as the API does."""
    if manifest.job_id != batch_id:
        manifest.job_id = batch_id
        with contextlib.suppress(BatchrunError):  # only a name: the batch runs without it
            save_manifest(paths, manifest)


@dataclass(frozen=True)
class ServedBatch:
    """A job directory that is a batch of `batchrun serve`: its id and the server's root."""

    batch_id: str
    root: Path

    def serve_command(self) -> str:
        """The command that runs the batch (again, after the server stopped)."""
        return f"batchrun serve --root {shlex.quote(str(self.root))}"

    def refusal(self, command: str) -> str:
        """Why `command` (resume, retry-failed) does not run this job."""
        return (
            f"this job is batch {self.batch_id} of `{self.serve_command()}`; it runs there "
            f"(the API's batch), not with {command}"
        )


def served_batch(job_dir: Path) -> ServedBatch | None:
    """The batch a job directory is (ROOT/batches/<batch id>, beside its batch.json), or None."""
    # The root as the job directory names it (a relative path stays one), else its absolute path.
    where = Path(os.path.normpath(job_dir))
    if len(where.parts) < 3 or ".." in where.parts:
        where = Path(os.path.abspath(job_dir))
    if not is_batch_id(where.name) or not (where / RECORD_NAME).is_file():
        return None
    return ServedBatch(where.name, where.parent.parent)
