"""The core of each command: submit, resume and retry-failed a job; the CLI only calls these."""

from __future__ import annotations

import contextlib
import itertools
import os
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from batchrun.config import (
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_MAX_BATCH,
    DEFAULT_MIN_BATCH,
    MAX_ATTEMPTS_LIMIT,
    MAX_BATCH_SIZE,
    EngineSettings,
    GivenOptions,
    OptionError,
    check_gpus,
    check_number,
    parse_gpus,
)
from batchrun.console.progress import ProgressReporter
from batchrun.console.text import command, plural
from batchrun.errors import BatchrunError
from batchrun.job.inputmap import write_input_map
from batchrun.job.journal import JournalWriter, invalid_record, read_records
from batchrun.job.lock import job_lock
from batchrun.job.manifest import (
    find_input,
    input_location,
    load_manifest,
    new_job_id,
    save_manifest,
)
from batchrun.job.paths import INPUT_MAP_PREFIX, JobPaths
from batchrun.job.state import FAILED_RETRYABLE, OK, JobState, replay
from batchrun.openai.reader import check_input_file, hash_file, read_input
from batchrun.openai.records import LineError, Request
from batchrun.run.scheduler import Scheduler
from batchrun.run.sizing import Probe
from batchrun.run.tuning import cached_size, lower_size, remember_size, search_batch_size
from batchrun.workers.devices import device_name, worker_envs
from batchrun.workers.process import Worker

# Where the runner says what it does before a run starts (the model conversion, the overrides).
Notify = Callable[[str], None]


@dataclass
class RunOptions:
    """How to run a job's engine workers (saved in the manifest so `resume` reuses them)."""

    settings: EngineSettings = field(default_factory=EngineSettings)
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    batch_size: int | None = None  # fixed by hand; None: search
    min_batch: int = DEFAULT_MIN_BATCH
    max_batch: int = DEFAULT_MAX_BATCH
    gpus: list[str] | None = None
    workers: int | None = None
    progress: bool = True
    # A Ray cluster address ("local" starts one here); per run, not saved: a job started on Ray
    # can be resumed without it and the other way round.
    ray: str | None = None

    @classmethod
    def from_given(cls, given: GivenOptions, *, progress: bool, ray: str | None) -> RunOptions:
        """The options of a new job: those given, the defaults for the rest."""
        options = cls(progress=progress, ray=ray)
        options.apply(given)
        return options

    def get(self, name: str) -> Any:
        """The value of a GivenOptions field (e.g. `dtype`, `min_batch_size`) in these options."""
        if name in _SETTINGS_FIELDS:
            return getattr(self.settings, name)
        return getattr(self, _RUN_FIELDS.get(name, name))

    def apply(self, given: GivenOptions) -> dict[str, tuple[Any, Any]]:
        """Put the options given over these; returns what changed, as {name: (old, new)}."""
        changed: dict[str, tuple[Any, Any]] = {}
        for name, value in given.given().items():
            new = parse_gpus(value) if name == "gpus" else value
            old = self.get(name)
            if new == old:
                continue
            changed[name] = (old, new)
            if name in _SETTINGS_FIELDS:
                setattr(self.settings, name, new)
            else:
                setattr(self, _RUN_FIELDS.get(name, name), new)
        return changed

    def check(self) -> None:
        """Refuse values no run could take, before they are saved into a job (OptionError)."""
        self.settings.check()
        check_number("--max-attempts", self.max_attempts, 1, MAX_ATTEMPTS_LIMIT)
        if self.batch_size is not None:
            check_number("--batch-size", self.batch_size, 1, MAX_BATCH_SIZE)
        check_number("--min-batch-size", self.min_batch, 1, MAX_BATCH_SIZE)
        check_number("--max-batch-size", self.max_batch, 1, MAX_BATCH_SIZE)
        if self.min_batch > self.max_batch:
            raise OptionError(
                ("--min-batch-size", "--max-batch-size"),
                f"the lower bound {self.min_batch} is above the upper bound {self.max_batch}",
            )
        if self.workers is not None:
            check_number("--workers", self.workers, 1)
        if self.gpus is not None:
            check_gpus(self.gpus)
            tp = self.settings.tensor_parallel_size
            # Known before any worker starts only when the GPUs are named (otherwise the
            # visible ones are counted when the workers start).
            if self.settings.engine == "vllm" and self.ray is None and len(self.gpus) < tp:
                raise OptionError(
                    ("--tensor-parallel-size", "--gpus"),
                    f"{tp} GPUs per engine need at least {tp} GPUs, but --gpus names "
                    f"{len(self.gpus)}",
                )


# GivenOptions fields that live in EngineSettings, and those named differently in RunOptions.
_SETTINGS_FIELDS = frozenset(
    {
        "engine",
        "model",
        "max_model_len",
        "dtype",
        "gpu_memory_utilization",
        "tensor_parallel_size",
        "enforce_eager",
        "seed",
    }
)
_RUN_FIELDS = {"min_batch_size": "min_batch", "max_batch_size": "max_batch"}


@dataclass
class JobSummary:
    """What a command did, for the summary table and the exit code."""

    job_dir: Path
    manifest: dict[str, Any]
    state: JobState
    wall_s: float
    run_completion_tokens: int = 0
    run_outcomes: int = 0
    # The options resume or retry-failed replaced, as `--dtype bfloat16 (was banana)`.
    overrides: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        """Valid requests plus invalid lines."""
        return int(self.manifest["requests"]) + int(self.manifest["invalid"])

    @property
    def exit_code(self) -> int:
        """0 when every request succeeded, 1 otherwise."""
        ok = self.state.succeeded == int(self.manifest["requests"]) and self.state.invalid == 0
        return 0 if ok else 1


# ---------------------------------------------------------------------------------------------


def submit(
    input_path: Path,
    job_dir: Path,
    options: RunOptions,
    *,
    tune_only: bool = False,
    notify: Notify | None = None,
) -> JobSummary:
    """Validate the input, create the job directory, and run the job to the end.

    With `tune_only`, stop after the batch-size search: the probes' results are kept in the
    journal and `resume` continues the job at the size found. Every option is checked before
    the job directory is made: a value no engine takes must never be saved into a job.
    """
    check_submit(job_dir, options)
    check_input_file(input_path)
    paths = JobPaths(job_dir)
    if paths.manifest.exists():
        raise BatchrunError(
            f"a job already exists in {job_dir}; continue it with "
            f"`{command('resume', job_dir)}`, or choose another --job-dir"
        )
    prepare_model(options.settings, notify or _to_stderr)
    created = not job_dir.exists()
    try:
        job_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BatchrunError(f"cannot create the job directory {job_dir}: {e.strerror or e}") from e
    with job_lock(paths):
        _discard_unfinished_validation(paths)
        try:
            manifest = _validate_into_job(input_path, paths, options)
        except (BatchrunError, KeyboardInterrupt):
            # No manifest yet, so nothing has run: leave the directory as it was, and running
            # the same submit again starts clean.
            if created:
                shutil.rmtree(job_dir, ignore_errors=True)
            else:
                for p in (paths.journal, paths.lock):
                    p.unlink(missing_ok=True)
            raise
        return _run(paths, manifest, options, mode="tune" if tune_only else "submit")


def check_submit(job_dir: Path, options: RunOptions) -> None:
    """Refuse, before anything is made, options no run could take and a job dir that is a file."""
    options.check()
    if job_dir.exists() and not job_dir.is_dir():
        raise OptionError("--job-dir", f"{job_dir} is a file, not a directory")


def resume(
    job_dir: Path,
    *,
    progress: bool = True,
    force: bool = False,
    ray: str | None = None,
    input_path: Path | None = None,
    given: GivenOptions | None = None,
    notify: Notify | None = None,
) -> JobSummary:
    """Continue a job: run only the requests with no finished attempt, then the retry passes.

    `input_path` points the job at its input's new place (a moved file); `given` holds engine
    options that replace the job's (saved into it).
    """
    return _continue(
        job_dir,
        "resume",
        progress=progress,
        ray=ray,
        force=force,
        input_path=input_path,
        given=given,
        notify=notify,
    )


def retry_failed(
    job_dir: Path,
    *,
    progress: bool = True,
    ray: str | None = None,
    given: GivenOptions | None = None,
    notify: Notify | None = None,
) -> JobSummary:
    """Run one more pass over the requests whose last attempt failed (`given`: as resume's)."""
    return _continue(job_dir, "retry", progress=progress, ray=ray, given=given, notify=notify)


def _continue(
    job_dir: Path,
    mode: str,
    *,
    progress: bool,
    ray: str | None,
    force: bool = False,
    input_path: Path | None = None,
    given: GivenOptions | None = None,
    notify: Notify | None = None,
) -> JobSummary:
    """resume and retry-failed: the job's options with those given over them, then run `mode`."""
    paths = JobPaths(job_dir)
    manifest = load_manifest(paths)
    with job_lock(paths):
        options = _options_from(manifest, progress)
        options.ray = ray
        say = notify or _to_stderr
        # Before the input is looked at: a bad option must change nothing (a forced resume
        # rewrites the job's idea of its input).
        changed = _merge_options(options, given or GivenOptions())
        if {"engine", "model"} & changed.keys():
            prepare_model(options.settings, say)
        _check_input_unchanged(paths, manifest, force=force, new_input=input_path)
        overrides = _save_overrides(paths, manifest, options, changed, say)
        summary = _run(paths, manifest, options, mode=mode)
        summary.overrides = overrides
        return summary


def prepare_model(settings: EngineSettings, notify: Notify) -> None:
    """Set the model to load and the name responses report: check --model, or convert the
    embedded default model once (in a child process, so that this process, the journal's owner,
    never imports torch or transformers)."""
    from batchrun import models

    if settings.engine != "vllm":
        settings.model_name = Path(settings.model).name if settings.model else "echo"
        return
    if settings.model is not None:
        settings.model, settings.model_name = models.resolve_model(settings.model)
        return
    if not models.default_model_ready():
        models.packaged_gguf()  # a clear message when the package is missing
        notify("converting the embedded default model once (about 20 s)...")
        proc = subprocess.run(
            [sys.executable, "-m", "batchrun.models"], capture_output=True, text=True
        )
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["unknown error"])[-1]
            raise BatchrunError(f"could not prepare the default model: {last}")
    settings.model_name = models.DEFAULT_MODEL_NAME


def _to_stderr(line: str) -> None:
    sys.stderr.write(line + "\n")


def _merge_options(options: RunOptions, given: GivenOptions) -> dict[str, tuple[Any, Any]]:
    """Put the options given over the job's and check the result; returns what changed.

    A bad value given is a usage error (exit 2). A bad value the job saved (by an older
    batchrun, or edited by hand) would fail every run: the message says which option replaces it.
    """
    changed = options.apply(given)
    try:
        options.check()
    except OptionError as e:
        named = {"--" + name.replace("_", "-") for name in given.given()}
        if named & set(e.options):
            raise
        flags = " / ".join(e.options)
        raise OptionError(
            e.options,
            f"the job's saved {flags} {e}; pass {' or '.join(e.options)} to replace it",
            exit_code=1,
        ) from e
    return changed


def _save_overrides(
    paths: JobPaths,
    manifest: dict[str, Any],
    options: RunOptions,
    changed: dict[str, tuple[Any, Any]],
    notify: Notify,
) -> list[str]:
    """Save the options that replaced the job's into its manifest, and say so before the run."""
    if not changed:
        return []
    if "batch_size" in changed:
        manifest.update(batch_size=options.batch_size, batch_size_source="fixed")
    elif {"min_batch_size", "max_batch_size"} & changed.keys():
        size = manifest.get("batch_size")
        fixed = manifest.get("batch_size_source") == "fixed"
        if size and not fixed and not options.min_batch <= int(size) <= options.max_batch:
            # Found within the old bounds: search again within the new ones.
            manifest.update(batch_size=None, batch_size_source=None)
    manifest.update(
        engine=options.settings.to_dict(),
        model=options.settings.model_name,
        max_attempts=options.max_attempts,
        batch_bounds=[options.min_batch, options.max_batch],
        gpus=options.gpus,
        workers=options.workers,
    )
    manifest.setdefault("overrides", []).append(
        {"at": time.time(), "options": {k: {"old": o, "new": n} for k, (o, n) in changed.items()}}
    )
    save_manifest(paths, manifest)
    lines = [_describe_override(name, old, new) for name, (old, new) in changed.items()]
    notify("overrides: " + ", ".join(lines))
    return lines


def _describe_override(name: str, old: Any, new: Any) -> str:
    """`--dtype bfloat16 (was banana)`; a switch shows as itself (`--no-enforce-eager`)."""

    def shown(value: Any) -> str:
        if value is None:
            return "not set"
        if isinstance(value, bool):
            return f"--{'' if value else 'no-'}{name.replace('_', '-')}"
        if isinstance(value, list):
            return ",".join(map(str, value))
        return str(value)

    flag = shown(new) if isinstance(new, bool) else f"--{name.replace('_', '-')} {shown(new)}"
    return f"{flag} (was {shown(old)})"


# ---------------------------------------------------------------------------------------------


def _discard_unfinished_validation(paths: JobPaths) -> None:
    """Drop the journal a submit killed while validating left behind (there is no manifest yet).

    Such a journal holds only invalid-line records, which validating again writes anew; keeping
    them would count every invalid line twice. A journal with anything else in it is finished
    work whose manifest went missing: never thrown away.
    """
    if not paths.journal.exists():
        return
    kinds = {rec.get("kind") for rec in read_records(paths.journal, strict=False)}
    if kinds <= {"invalid"}:
        paths.journal.unlink()
        return
    raise BatchrunError(
        f"{paths.root} holds a journal with finished requests but no {paths.manifest.name}; "
        f"export its results with `{command('export', paths.root)}`, restore "
        f"{paths.manifest.name}, or choose another --job-dir"
    )


def _validate_into_job(input_path: Path, paths: JobPaths, options: RunOptions) -> dict[str, Any]:
    """Stream-validate the input; invalid lines go to the journal as error records."""
    valid = invalid = json_errors = 0
    url: str | None = None
    first_error: LineError | None = None
    with JournalWriter(paths.journal, group=4096) as journal:
        batch: list[dict[str, Any]] = []
        for item in read_input(input_path):
            if isinstance(item, Request):
                valid += 1
                url = url or item.url
                continue
            invalid += 1
            if item.code == "invalid_json":
                json_errors += 1
            first_error = first_error or item
            batch.append(invalid_record(item))
            if len(batch) >= 1024:
                journal.append(batch)
                batch = []
        journal.append(batch)
    if valid == 0 and invalid > 0 and json_errors == invalid:
        assert first_error is not None
        raise BatchrunError(
            f"{input_path} is not a JSONL file of requests (line {first_error.line}: "
            f"{first_error.message})"
        )
    # The engine needs the endpoint: embeddings run vLLM as a pooling model.
    options.settings.endpoint = url
    now = time.time()
    manifest: dict[str, Any] = {
        "format": 1,
        "job_id": new_job_id(),
        "created_at": now,
        **input_location(paths, input_path),
        "input_sha256": hash_file(input_path),
        "input_bytes": input_path.stat().st_size,
        "requests": valid,
        "invalid": invalid,
        "endpoint": url,
        "model": options.settings.model_name,
        "engine": options.settings.to_dict(),
        "max_attempts": options.max_attempts,
        "batch_size": options.batch_size,
        "batch_size_source": "fixed" if options.batch_size else None,
        "batch_bounds": [options.min_batch, options.max_batch],
        "probes": [],
        "gpus": options.gpus,
        "workers": options.workers,
        "status": "validated",
        "counts": {"total": valid + invalid, "succeeded": 0, "failed": 0, "invalid": invalid},
        "runs": [],
    }
    save_manifest(paths, manifest)
    return manifest


def _options_from(manifest: dict[str, Any], progress: bool) -> RunOptions:
    """The options the job saved, as saved: RunOptions.check says which one is bad, if any."""
    bounds = manifest.get("batch_bounds")
    if not (isinstance(bounds, list) and len(bounds) == 2):
        bounds = [DEFAULT_MIN_BATCH, DEFAULT_MAX_BATCH]
    return RunOptions(
        settings=EngineSettings.from_dict(manifest.get("engine") or {}),
        max_attempts=manifest.get("max_attempts", DEFAULT_MAX_ATTEMPTS),
        batch_size=manifest.get("batch_size"),
        min_batch=bounds[0],
        max_batch=bounds[1],
        gpus=manifest.get("gpus"),
        workers=manifest.get("workers"),
        progress=progress,
    )


def _check_input_unchanged(
    paths: JobPaths, manifest: dict[str, Any], *, force: bool, new_input: Path | None = None
) -> None:
    """Find the job's input and check it is the file submitted; with `force`, take it as it is.

    The input is `new_input` (resume --input), else the file at its recorded path, else the one
    at its path relative to the job directory (a job moved together with its input). The
    manifest is updated to where it was found.
    """
    if new_input is not None:
        check_input_file(new_input)
        path = new_input
    else:
        found = find_input(paths, manifest)
        if found is None:
            job = shlex.quote(str(paths.root))
            raise BatchrunError(
                f"the job's input file {manifest['input_path']} is gone; put it back, or point "
                f"the job at its new place with: batchrun resume --job-dir {job} --input PATH "
                "(finished results can still be exported)"
            )
        check_input_file(found)  # unreadable or emptied: a clear line, not a traceback
        path = found
    digest = hash_file(path)
    # A forced resume reads the file again even when it is unchanged: that rebuilds a lost or
    # damaged input map, which is what the map's error messages advise.
    if digest == manifest["input_sha256"] and not (force and "input_map" in manifest):
        location = input_location(paths, path)
        if any(manifest.get(k) != v for k, v in location.items()):
            manifest.update(location)
            save_manifest(paths, manifest)
        return
    if force:
        _adopt_input(paths, manifest, path, digest)
        return
    if new_input is not None:
        raise BatchrunError(
            f"{path} is not the job's input file (its sha256 differs from the one submitted); "
            "pass --force to run it as the job's input as it is now "
            "(requests already finished are kept and not run again)"
        )
    raise BatchrunError(
        f"the input file {path} changed since the job was submitted (its sha256 differs); "
        "restore the original, or pass --force to run the file as it is now "
        "(requests already finished are kept and not run again)"
    )


def _adopt_input(paths: JobPaths, manifest: dict[str, Any], path: Path, digest: str) -> None:
    """Make the file as it is now the job's input (resume --force), read in one streaming pass.

    Its valid requests and their lines go to a new input map, its invalid lines to the journal
    tagged with the map's generation; the manifest, written last, makes both current at once.
    A crash before that leaves a map and records of a generation no manifest names: ignored.
    Requests whose custom_id left the file stay in the journal (it is append-only) but are no
    longer part of the job; finished ones still in it are not run again.
    """
    generation = uuid.uuid4().hex[:12]
    counts = {"requests": 0, "invalid": 0}
    urls: set[str] = set()
    with JournalWriter(paths.journal, group=4096) as journal:

        def requests() -> Iterator[tuple[str, int]]:
            batch: list[dict[str, Any]] = []
            for item in read_input(path):
                if isinstance(item, Request):
                    counts["requests"] += 1
                    urls.add(item.url)
                    yield item.custom_id, item.line
                    continue
                counts["invalid"] += 1
                batch.append({**invalid_record(item), "generation": generation})
                if len(batch) >= 1024:
                    journal.append(batch)
                    batch = []
            journal.append(batch)

        name = write_input_map(paths, generation, requests())
    endpoint = manifest.get("endpoint")
    if endpoint and urls and urls != {endpoint}:
        (paths.root / name).unlink(missing_ok=True)
        raise BatchrunError(
            f"{path} now asks for {next(iter(urls))}, the job runs {endpoint}; "
            "submit it as a new job instead"
        )
    manifest.update(
        requests=counts["requests"],
        invalid=counts["invalid"],
        input_sha256=digest,
        input_bytes=path.stat().st_size,
        input_map={"file": name, "generation": generation},
        **input_location(paths, path),
    )
    manifest.setdefault("forced", []).append(time.time())
    save_manifest(paths, manifest)
    # Nothing reads an older map once the manifest names this one.
    for old in paths.root.glob(f"{INPUT_MAP_PREFIX}*.jsonl"):
        if old.name != name:
            old.unlink(missing_ok=True)


def _requests(input_path: Path, want: Callable[[Request], bool]) -> Iterator[Request]:
    for item in read_input(input_path):
        if isinstance(item, Request) and want(item):
            yield item


def _requests_in(input_path: Path, ids: set[str]) -> Iterator[Request]:
    return _requests(input_path, lambda r: r.custom_id in ids)


def _run(paths: JobPaths, manifest: dict[str, Any], options: RunOptions, mode: str) -> JobSummary:
    """Run the passes a command calls for, journaling every outcome; update the manifest."""
    started = time.monotonic()
    # Of the input as it is now: after a forced resume, only the requests still in the file.
    state = replay(paths, manifest)
    input_path = Path(manifest["input_path"])
    settings = options.settings
    worker_class: type[Worker] = Worker
    if options.ray:
        from batchrun.workers import ray as ray_backend

        resources = ray_backend.connect(options.ray, options.workers)
        count = ray_backend.actor_count(resources, settings.tensor_parallel_size, options.workers)
        envs: list[dict[str, str]] = [{} for _ in range(count)]
        worker_class = ray_backend.RayWorker
    else:
        envs = worker_envs(
            settings.engine, options.gpus, settings.tensor_parallel_size, options.workers
        )
        logs = paths.logs
        with contextlib.suppress(OSError):  # without it, worker output goes to the terminal
            logs.mkdir(exist_ok=True)
            for i, env in enumerate(envs):
                env["BATCHRUN_WORKER_LOG"] = str((logs / f"worker-{i}.log").resolve())
    requests_total = int(manifest["requests"])
    if mode == "retry":
        failed_ids = {cid for cid, last in state.last.items() if last != OK}
        total, initial = len(failed_ids), 0
    else:
        total, initial = requests_total, sum(1 for _ in state.last)
    reporter = ProgressReporter(
        total=total,
        initial=initial,
        desc="retry" if mode == "retry" else "requests",
        enabled=options.progress,
    )
    manifest["status"] = "running"
    run_info: dict[str, Any] = {"mode": mode, "started_at": time.time(), "pid": os.getpid()}
    manifest.setdefault("runs", []).append(run_info)
    save_manifest(paths, manifest)
    scheduler: Scheduler | None = None
    outcomes_before = sum(state.attempts.values())
    tokens_before = state.completion_tokens
    status = "failed"
    try:
        with JournalWriter(paths.journal) as journal:
            scheduler = Scheduler(settings, envs, journal, state, reporter, worker_class)
            scheduler.job_dir = paths.root
            scheduler.on_back_off = _keep_backed_off_size(paths, manifest, settings)
            try:
                if mode == "retry":
                    if failed_ids:  # else nothing to size or start an engine for
                        reporter.event(f"retrying {plural(len(failed_ids), 'failed request')}")
                        _choose_size(scheduler, manifest, options, paths, iter(()), reporter)
                        scheduler.run(_requests_in(input_path, failed_ids))
                elif (source := _nonempty(_requests(input_path, state.is_not_done))) is not None:
                    _choose_size(
                        scheduler, manifest, options, paths, source, reporter, search=mode == "tune"
                    )
                    if mode != "tune":
                        scheduler.run(source)
                        _retry_passes(scheduler, state, input_path, options.max_attempts, reporter)
            finally:
                scheduler.close()
        status = "completed"
    except KeyboardInterrupt:
        status = "interrupted"
        raise
    finally:
        reporter.close()
        if scheduler is not None:
            manifest["worker_info"] = scheduler.worker_info
        run_info["ray"] = options.ray
        _finish_manifest(paths, manifest, state, status, run_info, started)
        if options.ray:
            from batchrun.workers import ray as ray_backend

            ray_backend.shutdown()
    return JobSummary(
        job_dir=paths.root,
        manifest=manifest,
        state=state,
        wall_s=time.monotonic() - started,
        run_completion_tokens=state.completion_tokens - tokens_before,
        run_outcomes=sum(state.attempts.values()) - outcomes_before,
    )


def _nonempty(source: Iterator[Request]) -> Iterator[Request] | None:
    """`source` as it was, or None when it is empty (nothing left to size or run)."""
    first = next(source, None)
    return None if first is None else itertools.chain([first], source)


def _keep_backed_off_size(
    paths: JobPaths, manifest: dict[str, Any], settings: EngineSettings
) -> Callable[[int], None]:
    """What to do when a worker backs off after running out of memory: the job records the size
    now running (status shows it, resume starts there), and the size cache for this set-up comes
    down to it, so that the next job does not pay the same restarts again."""

    def backed_off(size: int) -> None:
        manifest.update(batch_size=size, batch_size_source="out-of-memory back-off")
        save_manifest(paths, manifest)
        device = "echo" if settings.engine == "echo" else device_name()
        lower_size(settings, device, size)

    return backed_off


def _choose_size(
    scheduler: Scheduler,
    manifest: dict[str, Any],
    options: RunOptions,
    paths: JobPaths,
    source: Iterator[Request],
    reporter: ProgressReporter,
    *,
    search: bool = False,
) -> None:
    """Use the job's batch size, a fixed one, a cached one, or search for one on `source`."""
    settings = options.settings
    device = "echo" if settings.engine == "echo" else device_name()
    # `search` (from `tune`) measures afresh, whatever an earlier job found.
    if not search and manifest.get("batch_size"):
        size = int(manifest["batch_size"])
        how = manifest.get("batch_size_source") or "job"
        reporter.event(f"batch size {size} ({how})")
        scheduler.resize(size)
        return
    if not search and (size_cached := cached_size(settings, device)) is not None:
        reporter.event(f"batch size {size_cached} (found by an earlier job on this set-up)")
        scheduler.resize(size_cached)
        manifest.update(batch_size=size_cached, batch_size_source="cache")
        save_manifest(paths, manifest)
        return
    reporter.event(
        f"searching for the batch size between {options.min_batch} and {options.max_batch} "
        "(the probes run this job's own requests)"
    )
    result = search_batch_size(scheduler, source, reporter, options.min_batch, options.max_batch)
    reporter.event(f"batch size {result.size} chosen")
    manifest.update(
        batch_size=result.size,
        batch_size_source="search",
        probes=[p.to_dict() for p in result.probes],
    )
    save_manifest(paths, manifest)
    # A search cut short by a small job measured too little to teach the next job anything.
    if any(p.ok and p.requests >= 2 * p.size for p in result.probes):
        remember_size(settings, device, result.size)


def _retry_passes(
    scheduler: Scheduler,
    state: JobState,
    input_path: Path,
    max_attempts: int,
    reporter: ProgressReporter,
) -> None:
    """Re-run retryable failures, a whole pass at a time, until `max_attempts` attempts in all."""
    while True:
        ids = {
            cid
            for cid, last in state.last.items()
            if last == FAILED_RETRYABLE and state.attempts.get(cid, 0) < max_attempts
        }
        if not ids:
            return
        attempt = min(state.attempts[c] for c in ids) + 1
        reporter.event(
            f"retry pass (attempt {attempt} of {max_attempts}): {plural(len(ids), 'failed request')}"
        )
        reporter.bar.total += len(ids)
        scheduler.run(_requests_in(input_path, ids))


def _finish_manifest(
    paths: JobPaths,
    manifest: dict[str, Any],
    state: JobState,
    status: str,
    run_info: dict[str, Any],
    started: float,
) -> None:
    if status == "completed":
        # "completed" only when every valid request has a finished attempt.
        done = sum(1 for _ in state.last)
        status = "completed" if done >= int(manifest["requests"]) else "incomplete"
    manifest["status"] = status
    manifest["counts"] = {
        "total": int(manifest["requests"]) + state.invalid,
        "succeeded": state.succeeded,
        "failed": state.failed,
        "invalid": state.invalid,
        "pending": max(0, int(manifest["requests"]) - len(state.last)),
    }
    manifest["tokens"] = {"prompt": state.prompt_tokens, "completion": state.completion_tokens}
    run_info.update(
        ended_at=time.time(), wall_s=round(time.monotonic() - started, 3), status=status
    )
    with contextlib.suppress(BatchrunError):
        save_manifest(paths, manifest)


__all__ = [
    "JobSummary",
    "Probe",
    "RunOptions",
    "check_submit",
    "prepare_model",
    "resume",
    "retry_failed",
    "submit",
]
