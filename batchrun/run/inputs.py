"""A job's input: validated into a new job, checked on resume (changed, moved, forced), and a
changed file adopted as the job's input (resume --force)."""

from __future__ import annotations

import shlex
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from batchrun.errors import BatchrunError
from batchrun.job.cost import COST_NAME
from batchrun.job.events import EVENTS_NAME
from batchrun.job.inputmap import write_input_map
from batchrun.job.journal import JOURNAL_NAME, JournalWriter, read_records
from batchrun.job.journal_records import InvalidRecord, invalid_record
from batchrun.job.manifest import (
    InputMapRef,
    Manifest,
    find_input,
    input_location,
    new_job_id,
    save_manifest,
)
from batchrun.job.paths import (
    ERRORS_NAME,
    INPUT_MAP_PREFIX,
    LOCK_NAME,
    MANIFEST_NAME,
    OUTPUT_NAME,
    PARQUET_NAME,
    REPORT_NAME,
    JobPaths,
    command,
)
from batchrun.job.run_clock import CLOCK_NAME
from batchrun.job.shards import SHARDS_DIR, shards_dir
from batchrun.job.summary import SUMMARY_NAME
from batchrun.job.vectors import vectors_path
from batchrun.openai.reader import check_input_file, hash_file, holds_json_array, read_input
from batchrun.openai.records import LineError, Request
from batchrun.openai.routing import count_model
from batchrun.run.options import RunOptions
from batchrun.run.source import InputIndex

# The files batchrun writes into a job directory (besides those in logs/ and shards/, and its
# input maps): an input at one of these places would be deleted or written over by the job.
JOB_FILE_NAMES = frozenset(
    {
        JOURNAL_NAME, vectors_path(Path(JOURNAL_NAME)).name, MANIFEST_NAME, LOCK_NAME, SUMMARY_NAME, EVENTS_NAME,
        CLOCK_NAME, COST_NAME, OUTPUT_NAME, ERRORS_NAME, PARQUET_NAME, REPORT_NAME, SHARDS_DIR,
    }
)  # fmt: skip


def refuse_input_among_job_files(input_path: Path, paths: JobPaths) -> None:
    """Refuse an input file that lies where the job keeps one of its own files (its journal,
    an export's output.jsonl, a worker's log): the job would delete it or write over it."""
    try:
        source, root = input_path.resolve(), paths.root.resolve()
    except OSError:
        return  # unresolvable: the input's own checks say why
    inside = source.parent == root and (
        source.name in JOB_FILE_NAMES or source.name.startswith(INPUT_MAP_PREFIX)
    )
    ours = (paths.logs, shards_dir(paths.root))  # the workers' folders
    if inside or any(source.is_relative_to(p.resolve()) for p in ours):
        raise BatchrunError(
            f"the input file {input_path} lies where the job keeps its own "
            f"{source.relative_to(root)}, which the job would write over; move the input "
            "out of the job directory, or give it another name"
        )


def discard_unfinished_validation(paths: JobPaths) -> None:
    """Drop the journal a submit killed while validating left behind (there is no manifest yet).

    Such a journal holds only invalid-line records, which validating again writes anew; keeping
    them would count every invalid line twice. A journal with anything else in it is finished
    work whose manifest went missing: never thrown away; and a file that is not a journal of
    batchrun's (a line that is no record of it) is someone else's, never deleted either.
    """
    if not paths.journal.exists():
        return
    try:
        kinds = {rec.get("kind") for rec in read_records(paths.journal)}
    except BatchrunError:
        raise BatchrunError(
            f"{paths.journal} is not a journal of batchrun's (a line of it is no batchrun "
            "record), and the job would keep its own there; move that file, or choose "
            "another --job-dir"
        ) from None
    if kinds <= {"invalid"}:
        paths.journal.unlink()
        paths.vectors.unlink(missing_ok=True)
        shutil.rmtree(paths.shards, ignore_errors=True)
        return
    raise BatchrunError(
        f"{paths.root} holds a journal with finished requests but no {paths.manifest.name}; "
        f"export its results with `{command('export', paths.root)}`, restore "
        f"{paths.manifest.name}, or choose another --job-dir"
    )


def validate_into_job(
    input_path: Path,
    paths: JobPaths,
    options: RunOptions,
    index: InputIndex,
    *,
    input_url: str | None = None,
    input_sha256: str | None = None,
) -> Manifest:
    """Stream-validate the input; invalid lines go to the journal as error records.

    `index` records what the pass finds, so that the run pass after it reads the file cheaply.
    `input_url`: where the input was fetched from (`input_path` is then the job's own copy,
    whose sha256 the download took as `input_sha256`: the file is not read again for it).
    """
    if holds_json_array(input_path):  # as check_input_file refuses it (a batch of serve too)
        raise BatchrunError(
            f"{input_url or input_path} holds a JSON array, not JSONL (one request object a line)"
        )
    valid = invalid = json_errors = 0
    # Per model (several models or adapters: status counts per model, run/model_routes.py).
    model_requests: dict[str, int] = {}
    url: str | None = None
    first_error: LineError | None = None
    with JournalWriter(paths.journal, group=4096) as journal:
        batch: list[InvalidRecord] = []
        for item in index.read(input_path):
            if isinstance(item, Request):
                valid += 1
                url = url or item.url
                if index.known is not None:
                    count_model(model_requests, item.body, options.settings.model_name)
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
            f"{input_url or input_path} is not a JSONL file of requests (line {first_error.line}: "
            f"{first_error.message})"
        )
    # The engine needs the endpoint: embeddings, score and rerank run vLLM as a pooling model.
    options.settings.endpoint = url
    now = time.time()
    input_abs, input_rel = input_location(paths, input_path)
    manifest = Manifest(
        job_id=new_job_id(),
        created_at=now,
        input_path=input_abs,
        input_relpath=input_rel,
        input_url=input_url,
        input_sha256=input_sha256 or hash_file(input_path),
        input_bytes=input_path.stat().st_size,
        requests=valid,
        invalid=invalid,
        endpoint=url,
        model=options.settings.model_name,
        engine=options.settings.to_dict(),
        max_attempts=options.max_attempts,
        batch_size=options.batch_size,
        batch_size_source="fixed" if options.batch_size else None,
        batch_bounds=[options.min_batch, options.max_batch],
        gpus=options.gpus,
        workers=options.workers,
        order=options.order,
        model_requests=model_requests,
        vocab_sizes=dict(index.vocab.sizes) if index.vocab is not None else None,
        cache_dir=str(options.cache_dir.resolve()) if options.cache_dir is not None else None,
        counts={"total": valid + invalid, "succeeded": 0, "failed": 0, "invalid": invalid},
    )
    save_manifest(paths, manifest)
    return manifest


def check_input_unchanged(
    paths: JobPaths,
    manifest: Manifest,
    *,
    force: bool,
    new_input: Path | None = None,
    index: InputIndex | None = None,
) -> None:
    """Find the job's input and check it is the file submitted; with `force`, take it as it is.

    The input is `new_input` (resume --input), else the file at its recorded path, else the one
    at its path relative to the job directory (a job moved together with its input). The
    manifest is updated to where it was found. `index` records a forced read of the file, for
    the run pass after it.
    """
    if new_input is not None:
        check_input_file(new_input)
        refuse_input_among_job_files(new_input, paths)
        path = new_input
    else:
        found = find_input(paths, manifest)
        if found is None:
            job = shlex.quote(str(paths.root))
            # The job's copy of an input fetched from a URL: the URL is where to get it again.
            fetched = f" (fetched from {manifest.input_url})" if manifest.input_url else ""
            raise BatchrunError(
                f"the job's input file {manifest.input_path}{fetched} is gone; put it back, or point "
                f"the job at its new place with: batchrun resume --job-dir {job} --input PATH "
                "(finished results can still be exported)"
            )
        check_input_file(found)  # unreadable or emptied: a clear line, not a traceback
        path = found
    digest = hash_file(path)
    # A forced resume reads the file again even when it is unchanged: that rebuilds a lost or
    # damaged input map, which is what the map's error messages advise.
    if digest == manifest.input_sha256 and not (force and manifest.input_map is not None):
        location = input_location(paths, path)
        if location != (manifest.input_path, manifest.input_relpath):
            manifest.input_path, manifest.input_relpath = location
            save_manifest(paths, manifest)
        return
    if force:
        _adopt_input(paths, manifest, path, digest, index)
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


def _adopt_input(
    paths: JobPaths,
    manifest: Manifest,
    path: Path,
    digest: str,
    index: InputIndex | None = None,
) -> None:
    """Make the file as it is now the job's input (resume --force), read in one streaming pass.

    Its valid requests and their lines go to a new input map, its invalid lines to the journal
    tagged with the map's generation; the manifest, written last, makes both current at once.
    A crash before that leaves a map and records of a generation no manifest names: ignored.
    Requests whose custom_id left the file stay in the journal (it is append-only) but are no
    longer part of the job; finished ones still in it are not run again.
    """
    generation = uuid.uuid4().hex[:12]
    counts = {"requests": 0, "invalid": 0}
    model_requests: dict[str, int] = {}
    urls: set[str] = set()
    with JournalWriter(paths.journal, group=4096) as journal:

        def requests() -> Iterator[tuple[str, int]]:
            batch: list[InvalidRecord] = []
            for item in index.read(path) if index is not None else read_input(path):
                if isinstance(item, Request):
                    counts["requests"] += 1
                    urls.add(item.url)
                    if index is not None and index.known is not None:
                        count_model(model_requests, item.body, manifest.model or "")
                    yield item.custom_id, item.line
                    continue
                counts["invalid"] += 1
                batch.append({**invalid_record(item), "generation": generation})
                if len(batch) >= 1024:
                    journal.append(batch)
                    batch = []
            journal.append(batch)

        name = write_input_map(paths, generation, requests())
    endpoint = manifest.endpoint
    if endpoint and urls and urls != {endpoint}:
        (paths.root / name).unlink(missing_ok=True)
        raise BatchrunError(
            f"{path} now asks for {next(iter(urls))}, the job runs {endpoint}; "
            "submit it as a new job instead"
        )
    manifest.requests = counts["requests"]
    manifest.model_requests = model_requests
    manifest.invalid = counts["invalid"]
    manifest.input_sha256 = digest
    manifest.input_bytes = path.stat().st_size
    manifest.input_map = InputMapRef(name, generation)
    manifest.input_path, manifest.input_relpath = input_location(paths, path)
    manifest.forced.append(time.time())
    save_manifest(paths, manifest)
    # Nothing reads an older map once the manifest names this one.
    for old in paths.root.glob(f"{INPUT_MAP_PREFIX}*.jsonl"):
        if old.name != name:
            old.unlink(missing_ok=True)
