"""The commands that run a job: submit, tune, resume and retry-failed. Each parses its options,
calls its core function in batchrun.run.jobs, and prints the summary; `report.guarded` maps
the errors to exit codes."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer

from batchrun import stopping
from batchrun.cli.cache import CacheDir
from batchrun.cli.exits import finish, guarded, out, plain, say
from batchrun.cli.metrics_options import GivenMetrics, metrics_options
from batchrun.cli.options import (
    InputFile,
    JobDir,
    NewJobDir,
    NoProgress,
    RayAddress,
    engine_options,
)
from batchrun.config import GivenOptions
from batchrun.job.paths import command, default_job_dir

if TYPE_CHECKING:
    from batchrun.console.render import JobSummary
    from batchrun.metrics.monitoring import Monitoring
    from batchrun.metrics.recorder import RunMetrics
    from batchrun.run.options import RunMode


def _start(
    ctx: typer.Context,
    input_file: str,
    job_dir: Path | None,
    given: GivenOptions,
    *,
    ray: str | None,
    no_progress: bool,
    tune_only: bool,
    monitoring: Monitoring | None = None,
    cache_dir: Path | None = None,
) -> NoReturn:
    """submit and tune: check every option, create the job, run it (or only its search)."""
    from batchrun.run.jobs import RunOptions, check_submit
    from batchrun.run.jobs import submit as run_submit

    job = job_dir or default_job_dir(input_file)
    stopping.set_job(job, again=shlex.join(["batchrun", *sys.argv[1:]]))

    def run() -> JobSummary:
        options = RunOptions.from_given(given, progress=not no_progress, ray=ray)
        options.cache_dir = cache_dir
        warnings = check_submit(job, options)  # a usage error comes before anything
        metrics = _monitor(monitoring)  # its port bound before the job is made
        return run_submit(
            input_file,
            job,
            options,
            tune_only=tune_only,
            notify=say,
            metrics=metrics,
            checked=warnings,
        )

    try:
        summary = guarded(ctx, run)
    finally:
        if monitoring is not None:
            monitoring.close()
    if not tune_only:
        finish(summary, "submit")
    from batchrun.console.render import print_probes

    print_probes(out, summary.manifest.probes, summary.manifest.batch_size)
    size = summary.manifest.batch_size
    plain(f"batch size {size}; run the rest with: {command('resume', job)}")
    raise typer.Exit(0)


@engine_options(override=False)
@metrics_options
def submit(
    ctx: typer.Context,
    input_file: InputFile,
    job_dir: NewJobDir = None,
    ray: RayAddress = None,
    no_progress: NoProgress = False,
    cache_dir: CacheDir = None,
    *,
    metrics: GivenMetrics,
    options: GivenOptions,
) -> None:
    """Validate INPUT_FILE, create a job, and run it to the end, checkpointing every result."""
    _start(
        ctx,
        input_file,
        job_dir,
        options,
        ray=ray,
        no_progress=no_progress,
        tune_only=False,
        monitoring=metrics.monitoring(),
        cache_dir=cache_dir,
    )


@engine_options(override=False, leave_out=("batch_size",))
def tune(
    ctx: typer.Context,
    input_file: InputFile,
    job_dir: NewJobDir = None,
    ray: RayAddress = None,
    no_progress: NoProgress = False,
    *,
    options: GivenOptions,
) -> None:
    """Create a job from INPUT_FILE and only search for its batch size: prints the probe table
    (size, status, time, throughput, memory). The probes' results are kept;
    `batchrun resume --job-dir DIR` runs the rest at the size found."""
    _start(ctx, input_file, job_dir, options, ray=ray, no_progress=no_progress, tune_only=True)


@engine_options(override=True)
@metrics_options
def resume(
    ctx: typer.Context,
    job_dir: JobDir,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Run even if the input file changed since submit: the job becomes the file as it is now (requests that left it are dropped, line numbers are the file's); those already finished are kept and not run again.",
        ),
    ] = False,
    input_file: Annotated[
        Path | None,
        typer.Option(
            "--input",
            help="The job's input file at its new place (a moved file): taken when its sha256 is the one submitted, or with --force.",
            show_default=False,
        ),
    ] = None,
    ray: RayAddress = None,
    no_progress: NoProgress = False,
    cache_dir: CacheDir = None,
    *,
    metrics: GivenMetrics,
    options: GivenOptions,
) -> None:
    """Continue a job after a crash, a kill or Ctrl-C: runs only what is not done. Engine
    options given replace the job's own (and are saved into it)."""
    _continue(
        ctx,
        job_dir,
        "resume",
        ray,
        no_progress,
        cache_dir,
        metrics,
        options,
        force=force,
        input_path=input_file,
    )


@engine_options(override=True)
@metrics_options
def retry_failed(
    ctx: typer.Context,
    job_dir: JobDir,
    ray: RayAddress = None,
    no_progress: NoProgress = False,
    cache_dir: CacheDir = None,
    *,
    metrics: GivenMetrics,
    options: GivenOptions,
) -> None:
    """Run one more pass over the requests whose last attempt failed. Engine options given
    replace the job's own (and are saved into it)."""
    _continue(ctx, job_dir, "retry", ray, no_progress, cache_dir, metrics, options)


def _continue(
    ctx: typer.Context,
    job_dir: Path,
    mode: RunMode,
    ray: str | None,
    no_progress: bool,
    cache_dir: Path | None,
    metrics: GivenMetrics,
    options: GivenOptions,
    force: bool = False,
    input_path: Path | None = None,
) -> None:
    """resume and retry-failed: continue the job with the run's metrics, print the summary."""
    from batchrun.run.jobs import continue_job

    stopping.set_job(job_dir, retry=mode == "retry")
    monitoring = metrics.monitoring()
    try:
        summary = guarded(
            ctx,
            lambda: continue_job(
                job_dir,
                mode,
                progress=not no_progress,
                ray=ray,
                force=force,
                input_path=input_path,
                given=options,
                notify=say,
                metrics=_monitor(monitoring),
                cache_dir=cache_dir,
            ),
        )
    finally:
        monitoring.close()
    finish(summary, "resume" if mode == "resume" else "retry-failed")


def _monitor(monitoring: Monitoring | None) -> RunMetrics | None:
    """Start the run's metrics (binding --metrics-port); a port that cannot be bound is one
    line and exit 2 (a BatchrunError for `guarded`), before anything is made or changed."""
    return monitoring.start(say) if monitoring is not None else None
