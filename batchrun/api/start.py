"""`batchrun.run` and `batchrun.submit`: a new job made and run to the end in this process, as
`batchrun submit` makes one; both return its `batchrun.Job`."""

from __future__ import annotations

import os
import secrets
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from batchrun.api.inprocess import in_process
from batchrun.api.job import Job
from batchrun.api.options import given_options, new_job_options
from batchrun.api.requests import INPUT_NAME, write_requests
from batchrun.errors import BatchrunError
from batchrun.job.paths import JobPaths, default_job_dir

if TYPE_CHECKING:
    from typing import Unpack

    from batchrun.api.options import EngineOptions


def run(
    requests: Any,
    *,
    job_dir: str | os.PathLike[str] | None = None,
    ray: str | None = None,
    progress: bool = True,
    cache_dir: str | os.PathLike[str] | None = None,
    api_key: str | None = None,
    **options: Unpack[EngineOptions],
) -> Job:
    """Run `requests` as a new job and return it when every request is answered.

    `requests`: request dicts in the OpenAI batch format (`custom_id`, `method`, `url`,
    `body`), an iterable of any length, or a pandas DataFrame / pyarrow Table with those
    columns; streamed into JOB_DIR/requests.jsonl, the job's input file. Invalid lines and
    failed requests do not raise: they are in the job's status and results (as the CLI reports
    them, where it exits 1). Options: the CLI's (`engine="echo"`, `batch_size=8`, ...);
    `api_key` the remote engine's (`--api-key`), for this call only, never saved in the job.

    Raises:
        BatchrunError: a bad option (the CLI's line; no job directory is made), a job_dir
            that holds a job already, or a request no JSON can hold.
        TypeError: an unknown option.
        KeyboardInterrupt: Ctrl-C, after the job is stopped as the CLI stops it; `resume()`
            continues it.
    """
    job = Path(job_dir) if job_dir is not None else _new_job_dir()
    with in_process(job, api_key):
        job_options = new_job_options(
            given_options("run", options), progress=progress, ray=ray, cache_dir=cache_dir
        )
        from batchrun.run.jobs import check_submit, refuse_existing_job, submit

        warnings = check_submit(job, job_options)  # before anything is made
        refuse_existing_job(job)
        input_path = job / INPUT_NAME
        if input_path.exists():  # never written over: it may be someone's own file
            raise BatchrunError(
                f"{input_path} exists already; remove it, or choose another job_dir"
            )
        created = not job.exists()
        try:
            job.mkdir(parents=True, exist_ok=True)
            if write_requests(requests, input_path) == 0:
                raise BatchrunError("no requests were given: a job needs at least one")
            submit(input_path, job, job_options, checked=warnings)
        except BaseException:
            if not JobPaths(job).manifest.exists():  # no job was made: leave nothing behind
                input_path.unlink(missing_ok=True)
                if created:
                    shutil.rmtree(job, ignore_errors=True)
            raise
    return Job(job)


def submit(
    path_or_url: str | os.PathLike[str],
    *,
    job_dir: str | os.PathLike[str] | None = None,
    ray: str | None = None,
    progress: bool = True,
    cache_dir: str | os.PathLike[str] | None = None,
    api_key: str | None = None,
    **options: Unpack[EngineOptions],
) -> Job:
    """Validate an OpenAI batch input file (a path, or an s3:// or fsspec URL), make a job of
    it and run it to the end, as `batchrun submit` does; returns the job. `job_dir` defaults to
    jobs/<input name>, as the CLI's. Raises as `run` does."""
    source = os.fspath(path_or_url)
    job = Path(job_dir) if job_dir is not None else default_job_dir(source)
    with in_process(job, api_key):
        job_options = new_job_options(
            given_options("submit", options), progress=progress, ray=ray, cache_dir=cache_dir
        )
        from batchrun.run.jobs import submit as submit_job

        submit_job(source, job, job_options)
    return Job(job)


def _new_job_dir() -> Path:
    """jobs/run-<time>-<random>: a new directory for a run given no job_dir."""
    return Path("jobs") / f"run-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
