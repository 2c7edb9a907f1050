"""`batchrun.run` and `batchrun.submit`: a new job made and run to the end in this process, as
`batchrun submit` makes one; both return its `batchrun.Job`."""

from __future__ import annotations

import os
import secrets
import shutil
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from batchrun.api.inprocess import in_process
from batchrun.api.job import Job
from batchrun.api.metrics import monitoring, started
from batchrun.api.options import given_options, new_job_options
from batchrun.api.requests import INPUT_NAME, write_requests
from batchrun.errors import BatchrunError
from batchrun.job.paths import JobPaths, default_job_dir

if TYPE_CHECKING:
    from typing import Unpack

    from batchrun.api.options import EngineOptions
    from batchrun.metrics.monitoring import Monitoring
    from batchrun.run.options import RunOptions


def run(
    requests: Any,
    *,
    job_dir: str | os.PathLike[str] | None = None,
    ray: str | None = None,
    progress: bool = True,
    cache_dir: str | os.PathLike[str] | None = None,
    api_key: str | None = None,
    metrics_port: int | None = None,
    metrics_host: str | None = None,
    metrics_pushgateway: str | None = None,
    gpu_hour_cost: float | None = None,
    **options: Unpack[EngineOptions],
) -> Job:
    """Run `requests` as a new job and return it when every request is answered.

    `requests`: request dicts in the OpenAI batch format (`custom_id`, `method`, `url`,
    `body`), an iterable of any length, or a pandas DataFrame / pyarrow Table with those
    columns; streamed into JOB_DIR/requests.jsonl, the job's input file. Invalid lines and
    failed requests do not raise: they are in the job's status and results (as the CLI reports
    them, where it exits 1). Options: the CLI's (`engine="echo"`, `batch_size=8`, ...);
    `api_key` the remote engine's (`--api-key`), for this call only, never saved in the job;
    `metrics_port`, `metrics_host`, `metrics_pushgateway` and `gpu_hour_cost` the CLI's
    metrics options (`--metrics-port`, ...), for this call's run: Prometheus metrics served
    or pushed while it runs, and its time priced in the job's status and report.

    Raises:
        BatchrunError: a bad option (the CLI's line; no job directory is made), a metrics
            port in use (the CLI's line), a job_dir that holds a job already, or a request no
            JSON can hold.
        TypeError: an unknown option.
        KeyboardInterrupt: Ctrl-C, after the job is stopped as the CLI stops it; `resume()`
            continues it.
    """
    job = Path(job_dir) if job_dir is not None else _new_job_dir()
    metrics = (metrics_port, metrics_host, metrics_pushgateway, gpu_hour_cost)
    with _checked("run", job, api_key, options, progress, ray, cache_dir, metrics) as checked:
        job_options, asked, warnings = checked
        from batchrun.run.jobs import refuse_existing_job, submit

        refuse_existing_job(job)
        input_path = job / INPUT_NAME
        if input_path.exists():  # never written over: it may be someone's own file
            raise BatchrunError(
                f"{input_path} exists already; remove it, or choose another job_dir"
            )
        created = not job.exists()
        try:
            with started(asked) as run_metrics:  # the port bound before the job is made
                job.mkdir(parents=True, exist_ok=True)
                if write_requests(requests, input_path) == 0:
                    raise BatchrunError("no requests were given: a job needs at least one")
                submit(input_path, job, job_options, metrics=run_metrics, checked=warnings)
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
    metrics_port: int | None = None,
    metrics_host: str | None = None,
    metrics_pushgateway: str | None = None,
    gpu_hour_cost: float | None = None,
    **options: Unpack[EngineOptions],
) -> Job:
    """Validate an OpenAI batch input file (a path, or an s3:// or fsspec URL), make a job of
    it and run it to the end, as `batchrun submit` does; returns the job. `job_dir` defaults to
    jobs/<input name>, as the CLI's. Raises as `run` does."""
    source = os.fspath(path_or_url)
    job = Path(job_dir) if job_dir is not None else default_job_dir(source)
    metrics = (metrics_port, metrics_host, metrics_pushgateway, gpu_hour_cost)
    with _checked("submit", job, api_key, options, progress, ray, cache_dir, metrics) as checked:
        job_options, asked, warnings = checked
        from batchrun.run.jobs import submit as submit_job

        with started(asked) as run_metrics:
            submit_job(source, job, job_options, metrics=run_metrics, checked=warnings)
    return Job(job)


@contextmanager
def _checked(
    function: str,
    job: Path,
    api_key: str | None,
    options: Mapping[str, Any],
    progress: bool,
    ray: str | None,
    cache_dir: str | os.PathLike[str] | None,
    metrics: tuple[int | None, str | None, str | None, float | None],
) -> Iterator[tuple[RunOptions, Monitoring | None, list[str]]]:
    """run and submit (`function`), in the process as a command runs: a new job's options,
    its metrics (not started) and the pre-flight check's warnings, every option checked before
    anything is made or the metrics port bound."""
    with in_process(job, api_key):
        job_options = new_job_options(
            given_options(function, options, override=False),
            progress=progress,
            ray=ray,
            cache_dir=cache_dir,
        )
        asked = monitoring(*metrics)
        from batchrun.run.jobs import check_submit

        yield job_options, asked, check_submit(job, job_options)


def _new_job_dir() -> Path:
    """jobs/run-<time>-<random>: a new directory for a run given no job_dir."""
    return Path("jobs") / f"run-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
