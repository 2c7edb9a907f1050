"""A batch's ends: validating its input into a new job, and finalizing a finished one (export,
output and error files, the terminal status). Both are safe to run again after a crash."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import time
from pathlib import Path
from typing import Any

from batchrun.errors import BatchrunError
from batchrun.export.job import export_job
from batchrun.export.jsonl import ERRORS_NAME, OUTPUT_NAME
from batchrun.job.figures import job_figures
from batchrun.job.files import fsync_dir, fsync_file
from batchrun.job.journal import read_records
from batchrun.job.journal_records import ResultRecord, result_record
from batchrun.job.lock import job_lock
from batchrun.job.manifest import load_manifest
from batchrun.job.paths import JobPaths
from batchrun.job.state import replay
from batchrun.openai.records import Outcome
from batchrun.run.inputs import discard_unfinished_validation, validate_into_job
from batchrun.run.model_routes import job_vocabularies, known_models, vocabularies
from batchrun.run.options import RunOptions
from batchrun.run.source import InputIndex, requests
from batchrun.serve.batches import BatchStore
from batchrun.serve.checks import expiry_seconds
from batchrun.serve.files import FileStore
from batchrun.serve.ids import output_file_id
from batchrun.serve.jobview import claim_job, job_facts, stamp_job
from batchrun.serve.router import ActiveJob
from batchrun.serve.unserved_models import served_models
from batchrun.serve.usage import token_details

INPUT_NAME = "input.jsonl"
# The most invalid lines a failed batch lists in `errors.data` (all are in the job's journal).
MAX_LISTED_ERRORS = 1000
# Why a batch whose input holds no line at all (blank lines only) failed.
EMPTY = {
    "code": "empty_file",
    "message": "The input file holds no requests (it is empty or has only blank lines).",
    "line": None,
    "param": None,
}
# A fault to test with: seconds to wait after making an output file, before saving its id.
PAUSE_AFTER_OUTPUT_ENV = "BATCHRUN_SERVE_PAUSE_AFTER_OUTPUT_S"
EXPIRED = {
    "code": "batch_expired",
    "message": "This request could not be executed before the completion window expired.",
}


@dataclasses.dataclass
class Validated:
    """A batch's job, validated and locked, ready to run."""

    locks: contextlib.ExitStack
    index: InputIndex | None


def validate(
    batches: BatchStore, files: FileStore, options: RunOptions, batch_id: str
) -> Validated | None:
    """Validate a batch's input into its job (or find the job a run before this one made).

    Returns None when the batch failed here (no valid line: its record says why). Raises
    BatchrunError for an input that cannot be read at all.
    """
    record = batches.get(batch_id)
    assert record is not None
    paths = JobPaths(batches.job_dir(batch_id))
    locks = contextlib.ExitStack()
    try:
        locks.enter_context(job_lock(paths))
        index: InputIndex | None = None
        # With adapters or several models, a line names one of them: every read of the input
        # must know them (an unknown name is an error record, model_not_found).
        known = known_models(options.settings)
        if paths.manifest.exists():
            manifest = load_manifest(paths)
            # A restart with other models: read by this server's names (serve/unserved_models.py).
            served = served_models(options.settings, manifest)
            # Always an index: it carries the vocabulary sizes the batch was accepted with.
            index = InputIndex(served, job_vocabularies(manifest))
        else:
            discard_unfinished_validation(paths)
            source = _input_copy(files, str(record.batch["input_file_id"]), paths.root)
            index = InputIndex(known, vocabularies(options.settings))
            run_options = dataclasses.replace(
                options, settings=dataclasses.replace(options.settings)
            )
            manifest = validate_into_job(source, paths, run_options, index)
        claim_job(paths, manifest, batch_id)
        facts = job_facts(manifest)
        if facts.requests > 0:
            return Validated(locks, index)
        # No valid line: the batch fails, its errors listed (OpenAI's `errors.data`).
        state = replay(paths, manifest)
        stamp_job(paths, manifest, "failed", state)  # as the API says
        locks.close()
        fail(batches, batch_id, invalid_lines(paths) or [dict(EMPTY)], total=facts.invalid)
        return None
    except BaseException:
        locks.close()
        raise


def _input_copy(files: FileStore, file_id: str, job_dir: Path) -> Path:
    """The batch's own copy of its input file (a hard link where it can), so that deleting the
    uploaded file later takes nothing from the batch."""
    target = job_dir / INPUT_NAME
    if target.exists():
        return target
    source = files.content(file_id)
    if files.get(file_id) is None or not source.exists():
        raise BatchrunError(f"the input file {file_id} was deleted before the batch started")
    tmp = job_dir / f".{INPUT_NAME}.tmp"
    tmp.unlink(missing_ok=True)
    try:
        os.link(source, tmp)
    except OSError:
        shutil.copyfile(source, tmp)
        fsync_file(tmp)  # a copy's bytes on the disk before its name is
    os.replace(tmp, target)
    fsync_dir(job_dir)
    return target


def invalid_lines(paths: JobPaths) -> list[dict[str, Any]]:
    """The first invalid lines of a job, as OpenAI's batch `errors.data` entries."""
    data: list[dict[str, Any]] = []
    for rec in read_records(paths.journal, strict=False):
        if rec.get("kind") == "invalid":
            error = rec.get("error") or {}
            data.append(
                {
                    "code": error.get("code"),
                    "message": error.get("message"),
                    "line": rec.get("line"),
                    "param": None,
                }
            )
            if len(data) >= MAX_LISTED_ERRORS:
                break
    return data


def fail(
    batches: BatchStore, batch_id: str, errors: list[dict[str, Any]], *, total: int = 0
) -> None:
    """Mark a batch failed before it ran, with its errors (cancelled, when a cancel came
    first; nothing when it has ended)."""
    batches.end(
        batch_id,
        "failed",
        errors={"object": "list", "data": errors},
        request_counts={"total": total, "completed": 0, "failed": total},
    )


def finalize(batches: BatchStore, files: FileStore, batch_id: str) -> None:
    """Export a finished batch's job, make files of its output and errors, and end the batch.

    Each step can run again: a file already made (its id in the record) is not made twice.
    """
    record = batches.get(batch_id)
    assert record is not None and record.final is not None
    job_dir = batches.job_dir(batch_id)
    paths = JobPaths(job_dir)
    manifest = load_manifest(paths)
    # Partial: a cancelled or failed batch still has pending requests, left out of both files.
    summary = export_job(job_dir, job_dir, partial=True)
    ids: dict[str, str | None] = {"output_file_id": None, "error_file_id": None}
    wanted = {
        "output_file_id": (summary.succeeded > 0, OUTPUT_NAME, "output"),
        "error_file_id": (summary.failed + summary.invalid > 0, ERRORS_NAME, "errors"),
    }
    for key, (nonempty, name, label) in wanted.items():
        if not nonempty:
            continue
        known = record.batch.get(key)
        if isinstance(known, str) and files.get(known) is not None:
            ids[key] = known
            continue
        made = files.add_copy(
            job_dir / name,
            f"{batch_id}_{label}.jsonl",
            "batch_output",
            expires_after=expiry_seconds(record.batch.get("output_expires_after")),
            file_id=output_file_id(batch_id, label),
            owner=record.owner,  # the batch's tenant's, as the batch is
        )
        ids[key] = made["id"]
        _fault_pause()
        batches.update(batch_id, **{key: made["id"]})  # remembered before the next step
    # The job's figures (job/figures.py), as `batchrun status` and `report` show them.
    figures, _ = job_figures(paths, manifest)
    details = token_details(job_dir / OUTPUT_NAME)
    usage = {
        "input_tokens": figures.prompt_tokens,
        "input_tokens_details": {"cached_tokens": details.cached_tokens},
        "output_tokens": figures.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": details.reasoning_tokens},
        "total_tokens": figures.prompt_tokens + figures.completion_tokens,
    }
    # Cancelled instead when a cancel came after the runner chose `final` (it is cancelling).
    batches.end(
        batch_id,
        record.final,
        **ids,
        usage=usage,
        request_counts={
            "total": figures.total,
            "completed": figures.succeeded,
            "failed": figures.failed + figures.invalid,
        },
    )


def _fault_pause() -> None:
    """A fault for the crash harness (scripts/chaos.py --serve): wait PAUSE_AFTER_OUTPUT_ENV
    seconds between making a batch's output file and saving its id, a window to kill in."""
    seconds = os.environ.get(PAUSE_AFTER_OUTPUT_ENV)
    if seconds:
        time.sleep(float(seconds))


def expire_rest(job: ActiveJob) -> None:
    """Journal each request of an expired batch that never ran as failed, `batch_expired` (not
    retried), so that the job, its export and `batchrun status` all say so."""
    now = round(time.time(), 3)
    records: list[ResultRecord] = []
    for request in requests(job.facts.input_path, job.state.is_not_done, job.index):
        outcome = Outcome(request.custom_id, False, 408, error=dict(EXPIRED))
        records.append(result_record(outcome, request.line, 1, now))
        if len(records) >= 1024:
            _journal_expired(job, records)
            records = []
    _journal_expired(job, records)


def _journal_expired(job: ActiveJob, records: list[ResultRecord]) -> None:
    job.journal.append(records)
    for rec in records:
        job.state.record(dict(rec))
    job.failed += len(records)
