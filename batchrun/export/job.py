"""Export a job: refuse while requests are pending (unless --partial), write the files, and say
what they hold."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import os
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ParamSpec, TypeVar

from batchrun.errors import BatchrunError
from batchrun.export.index import FAILED, JournalIndex, latest_by_request
from batchrun.export.jsonl import ERRORS_NAME, OUTPUT_NAME, write_errors, write_output
from batchrun.export.parquet import PARQUET_NAME, write_parquet
from batchrun.job.files import atomic_write, make_dirs
from batchrun.job.inputmap import load_input_map
from batchrun.job.manifest import (
    JobValidating,
    Manifest,
    find_input,
    load_manifest,
    recorded_runner,
)
from batchrun.job.paths import JobPaths
from batchrun.job.served import ENDED, ServedBatch, served_batch
from batchrun.job.state import INVALID, OK, PENDING

_WRITE_ADVICE = "check free space and permissions, or choose another --output-dir"

_P = ParamSpec("_P")
_R = TypeVar("_R")


def _without_gc(export: Callable[_P, _R]) -> Callable[_P, _R]:
    """Run `export` with the cycle collector paused: an export makes millions of short-lived
    objects and no cycles, and the collector, walking them, took a tenth of its time."""

    @functools.wraps(export)
    def run(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        if not gc.isenabled():
            return export(*args, **kwargs)
        gc.disable()
        try:
            return export(*args, **kwargs)
        finally:
            gc.enable()

    return run


@dataclass(frozen=True)
class ExportSummary:
    """What an export wrote: the files, and how many requests succeeded, failed, or were invalid."""

    paths: tuple[Path, ...]
    succeeded: int
    failed: int
    invalid: int
    # Valid requests with no finished attempt, not in the files; None when no manifest says how
    # many requests the job has.
    pending: int | None = None
    running_pid: int | None = None  # the process running the job while it was exported
    # How a `batchrun serve` batch ended before its pending requests ran (cancelled, expired,
    # failed): they never will, and the files hold what finished, as the API's do.
    ended: str | None = None

    @property
    def total(self) -> int:
        """All rows reported: requests plus invalid input lines."""
        return self.succeeded + self.failed + self.invalid

    def describe(self) -> str:
        """One line for people: the counts, and what the files lack when the export is partial."""
        text = (
            f"{self.succeeded:,} succeeded, {self.failed:,} failed, {self.invalid:,} invalid lines"
        )
        if self.pending and self.ended:
            text += f", {self.pending:,} not run (the batch was {self.ended})"
        elif self.pending:
            text += f", {self.pending:,} pending (not in the output: partial export)"
        if self.running_pid is not None:
            text += f"; the job is running (process {self.running_pid}), export again when it ends"
        return text


@_without_gc
def export_job(
    job_dir: Path, out_dir: Path, *, parquet: bool = False, partial: bool = False
) -> ExportSummary:
    """Export a job; refuse while requests are pending, unless `partial` (then count them) or
    the job is a `batchrun serve` batch that ended (its pending requests never run).

    Only reads the job directory and takes no lock, so it can run beside the job's own run.
    The requests are those of the input as it is now (after a forced resume, its input map).
    """
    paths = JobPaths(job_dir)
    manifest: Manifest | None = None
    try:
        manifest = load_manifest(paths)
    except JobValidating:
        raise  # its journal holds only what validation found so far
    except BatchrunError as e:
        if not paths.journal.exists():
            raise  # not a job at all
        if paths.manifest.exists() and not partial:
            raise BatchrunError(
                f"{e}; pass --partial to export the journal's results without it"
            ) from None
        # No manifest (a submit killed as it began): the journal's results, count of pending unknown.
    input_map = load_input_map(paths, manifest) if manifest is not None else None
    _prepare(out_dir)  # before the journal pass: a bad --output-dir fails at once
    if manifest is not None:
        names = (PARQUET_NAME,) if parquet else (OUTPUT_NAME, ERRORS_NAME)
        _refuse_writing_over_input(find_input(paths, manifest), out_dir, names)
    index = latest_by_request(paths.journal, input_map, shapes=parquet)
    pending: int | None = None
    running: int | None = None
    if manifest is not None:
        if input_map is not None:
            pending = index.count(PENDING)
        else:
            finished = index.count(OK, *FAILED)
            pending = max(0, manifest.requests - finished)
        running = recorded_runner(manifest)
    served = served_batch(manifest) if manifest is not None else None
    ended = manifest.status if served and manifest and manifest.status in ENDED else None
    if pending and not partial and ended is None:
        raise _still_pending(pending, job_dir, running, served)
    summary = _write_parquet(index, out_dir) if parquet else _write_jsonl(index, out_dir)
    return dataclasses.replace(summary, pending=pending, running_pid=running, ended=ended)


def _still_pending(
    pending: int, job_dir: Path, running: int | None, served: ServedBatch | None
) -> BatchrunError:
    """Why an export without --partial is refused, and what finishes the job: its run, the
    server a batch of `batchrun serve` runs on, or a resume."""
    are = "request is" if pending == 1 else "requests are"
    if running is not None:
        return BatchrunError(
            f"{pending:,} {are} still pending: the job is running (process {running}); "
            "wait for it to finish, or pass --partial to export only what is finished so far"
        )
    if served is not None:
        return BatchrunError(
            f"{pending:,} {are} still pending: this job is batch {served.batch_id}, which runs "
            f"on `{served.serve_command()}` (start it again to go on), or pass --partial to "
            "export only what is finished"
        )
    return BatchrunError(
        f"{pending:,} {are} still pending; continue the job with: batchrun resume "
        f"--job-dir {shlex.quote(str(job_dir))}, or pass --partial to export only what is "
        "finished"
    )


@_without_gc
def export_jsonl(job_dir: Path, journal_path: Path, out_dir: Path) -> ExportSummary:
    """Write output.jsonl and errors.jsonl (OpenAI batch output format) into `out_dir`.

    Line ids derive from the journal, not from `job_dir`'s path, so moving or renaming the job
    directory does not change them.
    """
    if not job_dir.is_dir():
        raise BatchrunError(f"no job directory at {job_dir}; check --job-dir")
    _prepare(out_dir)  # before the journal pass: a bad --output-dir fails at once
    return _write_jsonl(latest_by_request(journal_path, shapes=False), out_dir)


@_without_gc
def export_parquet(
    journal_path: Path, out_dir: Path, row_group_size: int = 10_000
) -> ExportSummary:
    """Write results.parquet (see `export.parquet`): one flat row per request and per invalid
    line, in row groups of `row_group_size`."""
    if row_group_size < 1:
        raise ValueError("row_group_size must be at least 1")
    _prepare(out_dir)
    return _write_parquet(latest_by_request(journal_path), out_dir, row_group_size)


def _write_jsonl(index: JournalIndex, out_dir: Path) -> ExportSummary:
    out_path, err_path = out_dir / OUTPUT_NAME, out_dir / ERRORS_NAME
    # Each file makes its own pass over the index, so neither holds the other's lines.
    atomic_write(out_path, lambda f: write_output(index, f), advice=_WRITE_ADVICE)
    atomic_write(err_path, lambda f: write_errors(index, f), advice=_WRITE_ADVICE)
    return _summary(index, (out_path, err_path))


def _write_parquet(
    index: JournalIndex, out_dir: Path, row_group_size: int = 10_000
) -> ExportSummary:
    path = out_dir / PARQUET_NAME
    atomic_write(path, lambda f: write_parquet(index, f, row_group_size), advice=_WRITE_ADVICE)
    return _summary(index, (path,))


def _summary(index: JournalIndex, paths: tuple[Path, ...]) -> ExportSummary:
    return ExportSummary(
        paths=paths,
        succeeded=index.count(OK),
        failed=index.count(*FAILED),
        invalid=index.count(INVALID),
    )


def _refuse_writing_over_input(source: Path | None, out_dir: Path, names: tuple[str, ...]) -> None:
    """Refuse an export whose file would replace the job's input (an input named output.jsonl
    in the output directory): the input is what resume and retry-failed read again."""
    if source is None:
        return
    for name in names:
        target = out_dir / name
        with contextlib.suppress(OSError):  # no such file: nothing to write over
            if os.path.samefile(target, source):
                raise BatchrunError(
                    f"exporting would write over the job's input file {source}; "
                    "choose another directory with --output-dir"
                )


def _prepare(out_dir: Path) -> None:
    try:
        # Its name durable too: an export reported written must survive a power cut.
        make_dirs(out_dir)
    except OSError as e:
        raise BatchrunError(
            f"cannot create the output directory {out_dir}: {e.strerror or e}; "
            "choose another with --output-dir"
        ) from e
    if not os.access(out_dir, os.W_OK | os.X_OK):
        raise BatchrunError(
            f"cannot write to the output directory {out_dir}: {_why_unwritable(out_dir)}; "
            "choose another with --output-dir"
        )


def _why_unwritable(out_dir: Path) -> str:
    """Why a directory os.access says is not writable cannot be written: its file system is
    mounted read-only, or its permissions."""
    try:
        read_only = bool(os.statvfs(out_dir).f_flag & os.ST_RDONLY)
    except OSError:
        read_only = False
    return "read-only file system" if read_only else "permission denied"
