"""The core of each command: submit, resume and retry-failed a job; the CLI only calls these."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from batchrun import timeline
from batchrun.config import GivenOptions, OptionError
from batchrun.errors import BatchrunError
from batchrun.job.files import make_dirs
from batchrun.job.lock import job_lock
from batchrun.job.manifest import Manifest, load_manifest
from batchrun.job.paths import JobPaths, command
from batchrun.job.served import served_batch
from batchrun.job.state import JobState, replay
from batchrun.openai.reader import check_input_file
from batchrun.run.answer_cache import check_cache_dir
from batchrun.run.early_start import StartedWorkers, start_continued_early, start_early
from batchrun.run.inputs import (
    check_input_unchanged,
    discard_unfinished_validation,
    refuse_input_among_job_files,
    validate_into_job,
)
from batchrun.run.model_prep import prepare_model
from batchrun.run.model_routes import job_vocabularies, prepare_models, vocabularies
from batchrun.run.options import (
    Notify,
    RunMode,
    RunOptions,
    merge_options,
    options_from,
    save_overrides,
)
from batchrun.run.passes import run_job
from batchrun.run.sizing import Probe
from batchrun.run.source import InputIndex
from batchrun.storage.fetch import (
    FETCHED_NAME,
    check_remote_input,
    fetch_input,
    local_path,
    remote_input,
)

if TYPE_CHECKING:
    from batchrun.console.render import JobSummary
    from batchrun.metrics import RunMetrics


def submit(
    input_file: Path | str,
    job_dir: Path,
    options: RunOptions,
    *,
    tune_only: bool = False,
    notify: Notify | None = None,
    metrics: RunMetrics | None = None,
    checked: list[str] | None = None,
) -> JobSummary:
    """Validate the input, create the job directory, and run the job to the end.

    `input_file` is a local path, or a URL (s3://, https:// ...) whose object is first brought
    into the job directory (storage/fetch.py), so that the job never needs the store again.
    With `tune_only`, stop after the batch-size search: the probes' results are kept in the
    journal and `resume` continues the job at the size found. Every option is checked before
    the job directory is made: a value no engine takes must never be saved into a job.
    `checked`: `check_submit`'s warnings, when the caller made that check already (the CLI does,
    before it binds its metrics port): the options are checked once (nvidia-smi runs once).
    """
    if tune_only and options.settings.spec.flow_control:
        raise OptionError(
            "--base-url",
            "has no batch size for tune to search: the remote engine's flow control finds its "
            "window as the job runs; use submit",
        )
    warnings = check_submit(job_dir, options) if checked is None else checked
    url = remote_input(str(input_file))
    if url is None:
        input_path = local_path(str(input_file))
        check_input_file(input_path)
    else:
        check_remote_input(url)  # a missing object or a store out of reach: before anything
    paths = JobPaths(job_dir)
    if url is None:
        refuse_input_among_job_files(input_path, paths)
    refuse_existing_job(job_dir)
    for line in warnings:
        (notify or _to_stderr)(line)
    # Each model (several: run/model_routes.py) and adapter, found and checked.
    known = prepare_models(options.settings, notify or _to_stderr)
    created = not job_dir.exists()
    try:
        make_dirs(job_dir)
    except OSError as e:
        raise BatchrunError(f"cannot create the job directory {job_dir}: {e.strerror or e}") from e
    # Said only once the job exists: a refusal before this point leaves no job to name (an
    # input from a URL: once it is in the job directory).
    if url is None:
        (notify or _to_stderr)(f"job dir: {job_dir}")
    with job_lock(paths):
        discard_unfinished_validation(paths)
        # What the validating pass finds, so that the run pass reads the file cheaply.
        index = InputIndex(known, vocabularies(options.settings))
        started: StartedWorkers | None = None
        try:
            digest = None
            if url is not None:
                input_path, digest = _fetch(url, paths)
                (notify or _to_stderr)(f"job dir: {job_dir}")
            # The engine starts while the input is validated (run/early_start.py).
            started = start_early(
                input_path, paths, options, index, notify or _to_stderr, search=tune_only
            )
            manifest = validate_into_job(
                input_path, paths, options, index, input_url=url, input_sha256=digest
            )
            timeline.mark("validated")
        except BaseException as e:
            if started is not None:
                started.stop()
            if not isinstance(e, BatchrunError | KeyboardInterrupt):
                raise
            # No manifest yet, so nothing has run: leave the directory as it was, and running
            # the same submit again starts clean.
            if created:
                shutil.rmtree(job_dir, ignore_errors=True)
            else:
                # (The fetched copy only: a local input may well lie in the job directory.)
                fetched = [paths.root / FETCHED_NAME] if url is not None else []
                for p in (paths.journal, paths.vectors, paths.lock, *fetched):
                    p.unlink(missing_ok=True)
                shutil.rmtree(paths.shards, ignore_errors=True)
            raise
        mode: RunMode = "tune" if tune_only else "submit"
        return run_job(
            paths, manifest, options, mode=mode, index=index, metrics=metrics, started=started
        )


def refuse_existing_job(job_dir: Path) -> None:
    """Refuse (BatchrunError) a job directory that holds a job already, naming what continues
    it: a new job must never be made over another's files."""
    paths = JobPaths(job_dir)
    if not paths.manifest.exists():
        return
    try:
        served = served_batch(load_manifest(paths))
    except BatchrunError:  # a damaged manifest: still a job, refused all the same
        served = None
    goes_on = (
        f"it runs on `{served.serve_command()}`"
        if served is not None
        else f"continue it with `{command('resume', job_dir)}`"
    )
    raise BatchrunError(
        f"a job already exists in {job_dir}; {goes_on}, or choose another --job-dir"
    )


def _fetch(url: str, paths: JobPaths) -> tuple[Path, str]:
    """Bring the input at `url` into the job directory and check it as a local input is
    checked (said with its URL: the copy is removed again when it is refused); returns the
    copy and its sha256, taken as it came."""
    fetched = fetch_input(url, paths.root)
    try:
        check_input_file(fetched.path)
    except BatchrunError as e:
        raise BatchrunError(str(e).replace(str(fetched.path), url)) from None
    return fetched.path, fetched.sha256


def check_submit(job_dir: Path, options: RunOptions) -> list[str]:
    """Refuse, before anything is made, options no run could take, a job dir that is a file,
    and a machine the job would not run as expected on (`preflight`); returns the
    pre-flight check's warnings."""
    options.check()
    if options.cache_dir is not None:
        check_cache_dir(options.cache_dir)
    if job_dir.exists() and not job_dir.is_dir():
        raise OptionError("--job-dir", f"{job_dir} is a file, not a directory")
    return preflight(options)


def continue_job(
    job_dir: Path,
    mode: RunMode,
    *,
    progress: bool = True,
    ray: str | None = None,
    force: bool = False,
    input_path: Path | None = None,
    given: GivenOptions | None = None,
    notify: Notify | None = None,
    metrics: RunMetrics | None = None,
    cache_dir: Path | None = None,
) -> JobSummary:
    """Continue a job: resume runs only the requests with no finished attempt, then the retry
    passes; retry one more pass over the requests whose last attempt failed.

    The job's options with `given` over them (engine options that replace the job's, saved into
    it); `force` and `input_path` (resume only) take its input changed, or at a new place.
    """
    paths = JobPaths(job_dir)
    manifest = load_manifest(paths)
    served = served_batch(manifest)
    if served is not None:  # its server runs it: a run of the CLI's would part it from the API's
        raise BatchrunError(served.refusal("resume" if mode == "resume" else "retry-failed"))
    with job_lock(paths):
        options = options_from(manifest, progress)
        options.ray = ray
        say = notify or _to_stderr
        if cache_dir is not None:  # before anything is saved or run
            check_cache_dir(cache_dir)
            options.cache_dir = cache_dir
        elif options.cache_dir is not None:
            options.cache_dir = _saved_cache_dir(options.cache_dir, say)
        # Before the input is looked at: a bad option must change nothing (a forced resume
        # rewrites the job's idea of its input).
        changed = merge_options(options, given or GivenOptions())
        for line in preflight(options):  # a machine the job cannot run on changes nothing
            say(line)
        # Every run resolves the model again: a hub id may have left the cache, a .gguf file
        # changed, the default model's conversion been deleted.
        # The same adapters as the job's first answers: a changed or missing one refuses.
        index = InputIndex(prepare_models(options.settings, say), job_vocabularies(manifest))
        check_input_unchanged(paths, manifest, force=force, new_input=input_path, index=index)
        # The job's own input, as it was submitted (no --force, no --input).
        same_input = not force and input_path is None
        started: StartedWorkers | None = None
        try:
            if same_input and not changed:
                # The engine starts while the journal is replayed (run/early_start.py).
                started = start_continued_early(
                    paths, manifest, options, index, say, retry=mode == "retry"
                )
            # A journal that cannot be read refuses the run here, before any option is saved.
            state = replay(paths, manifest)
            timeline.mark("replayed")
            work_left = _work_left(state, manifest, mode)
            if changed and same_input and not work_left:
                # Nothing will run with them: the job keeps the options its results came from.
                say("nothing to run: the options given were not saved")
                changed = {}
            overrides = save_overrides(paths, manifest, options, changed, say)
        except BaseException:
            if started is not None:
                started.stop()
            raise
        if started is not None and not work_left:  # the summary was behind: nothing to run
            started.stop()
            started = None
        summary = run_job(
            paths,
            manifest,
            options,
            mode=mode,
            index=index,
            state=state,
            metrics=metrics,
            started=started,
        )
        summary.overrides = overrides
        return summary


def _saved_cache_dir(cache_dir: Path, say: Notify) -> Path | None:
    """The job's own --cache-dir, or None with a line saying why when it can no longer be used:
    the cache only saves work, so a cache that went away must not stop the job."""
    try:
        check_cache_dir(cache_dir)
    except BatchrunError as e:
        say(f"running without the job's answer cache: {e}")
        return None
    return cache_dir


def _work_left(state: JobState, manifest: Manifest, mode: RunMode) -> bool:
    """Whether a `mode` run of the job has anything to run: a request with no finished attempt
    (resume), or one whose last attempt failed (retry)."""
    if mode == "retry":
        return state.failed > 0
    return state.done < manifest.requests


def _to_stderr(line: str) -> None:
    sys.stderr.write(line + "\n")


__all__ = [
    "Probe",
    "RunOptions",
    "check_submit",
    "continue_job",
    "prepare_model",
    "refuse_existing_job",
    "submit",
]


def preflight(options: RunOptions) -> list[str]:
    """Refuse (BatchrunError) a run that would not run as expected; returns its warnings.

    The doctor's checks (workers/diagnosis.py), made before anything is created: a job of an
    engine that uses GPUs refuses to start, in one line with the way out, on a problem that
    would stop or cripple it (the CPU build of vLLM with GPUs listed, nvidia-smi failing, GPU
    ids that name no visible GPU, ...); one that only wastes GPUs (left idle by the
    tensor-parallel grouping) starts, and the warning is returned for the caller to say.
    Engines that use no GPU (echo) are never refused. On Ray the GPUs are the cluster's, not
    this machine's: the actors' own start says what they find.
    """
    settings = options.settings
    if not settings.spec.uses_gpus or options.ray:
        return []
    from batchrun.workers.diagnosis import diagnose

    found = diagnose(
        gpus=options.gpus,
        tensor_parallel_size=settings.tensor_parallel_size,
        workers=options.workers,
        device=settings.device,
    )
    for problem in found.problems:
        if problem.fatal:
            raise BatchrunError(problem.line())
    return [f"warning: {p.line()}" for p in found.problems]
