"""The job's manifest: read, stamped and written atomically; where its input is."""

from __future__ import annotations

import contextlib
import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

import msgspec

from batchrun.config import DEFAULT_MAX_ATTEMPTS
from batchrun.errors import BatchrunError
from batchrun.job.files import atomic_write
from batchrun.job.lock import live_holder, process_alive
from batchrun.job.paths import MANIFEST_NAME, JobPaths, command

FORMAT_VERSION = 1


class Run(msgspec.Struct, kw_only=True):
    """One command's run of the job: submit, tune, resume or retry."""

    mode: str
    started_at: float
    pid: int
    ray: str | None = None
    ended_at: float | None = None
    wall_s: float | None = None
    status: str | None = None
    # This run's prefix-cache counters ({"queries", "hits"}: vLLM's, in prompt tokens) and the
    # requests it first answered with a copy of an identical one's outcome (the job's figure).
    prefix_cache: dict[str, int] | None = None
    deduplicated: int | None = None
    # What the run's time costs (job/cost.py): --gpu-hour-cost (USD an hour per GPU, or per
    # machine on a CPU) and the GPUs its workers hold (1 on a CPU).
    usd_per_hour: float | None = None
    units: int | None = None


class InputMapRef(msgspec.Struct):
    """The input map a forced resume wrote: its file name and generation."""

    file: str
    generation: str


class ServedBy(msgspec.Struct, kw_only=True):
    """The server that owns a job: `batchrun serve --root ROOT` runs it as batch `batch_id`."""

    batch_id: str
    root: str  # absolute


class Manifest(msgspec.Struct, kw_only=True):
    """The job's manifest (manifest.json): what the job is, how it runs, where it stands.

    Decoded and encoded by msgspec; a field added later has a default, so older jobs still load,
    and keys this version does not know are kept out of the way (ignored, not refused).
    """

    format: int = FORMAT_VERSION
    job_id: str
    created_at: float
    updated_at: float | None = None
    input_path: str
    input_relpath: str | None = None
    # The URL the input was fetched from (s3://...); input_path is then the job's own copy.
    input_url: str | None = None
    input_sha256: str
    input_bytes: int
    requests: int
    invalid: int
    endpoint: str | None = None
    model: str | None = None
    engine: dict[str, Any] = msgspec.field(default_factory=dict)
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    batch_size: int | None = None
    # How batch_size was found: fixed, search, cache, job, out-of-memory back-off.
    batch_size_source: str | None = None
    batch_bounds: list[int | None] | None = None
    probes: list[dict[str, Any]] = msgspec.field(default_factory=list)
    gpus: list[str] | None = None
    workers: int | None = None
    # The dispatch plan, --order (run/planner.py): resume and the retry passes follow it.
    order: str = "auto"
    # --cache-dir (absolute) the job was submitted with: resume and retry-failed keep using it.
    cache_dir: str | None = None
    # Valid requests per model their lines name (a base model or an adapter), counted when the
    # job has several models or adapters (run/model_routes.py); empty otherwise.
    model_requests: dict[str, int] = msgspec.field(default_factory=dict)
    # Each base model's vocabulary size, as submit checked the lines' token ids against it
    # (openai/token_ids.py): every later read of the input checks them the same way. None: a
    # job from before, or whose models' sizes were not known (the engine checks them).
    vocab_sizes: dict[str, int] | None = None
    # vLLM's prefix-cache counters summed over the job's runs that ended (a run killed with -9
    # loses its own): prompt tokens looked up, and found cached.
    prefix_cache: dict[str, int] = msgspec.field(default_factory=dict)
    # validated, running, completed, incomplete, interrupted, failed, stopped
    status: str = "validated"
    counts: dict[str, int] = msgspec.field(default_factory=dict)
    tokens: dict[str, int] | None = None
    runs: list[Run] = msgspec.field(default_factory=list)
    worker_info: dict[str, dict[str, Any]] | None = None
    input_map: InputMapRef | None = None
    forced: list[float] = msgspec.field(default_factory=list)
    overrides: list[dict[str, Any]] = msgspec.field(default_factory=list)
    # Set when the job is a batch of `batchrun serve` (job/served.py): its server runs it.
    served_by: ServedBy | None = None


class JobValidating(BatchrunError):
    """The job has no manifest yet because process `pid` is submitting it: validating its input."""

    def __init__(self, root: Path, pid: int) -> None:
        super().__init__(
            f"the job at {root} is being submitted by process {pid}, which is still validating "
            f"its input; `{command('status', root)}` shows when it runs"
        )
        self.pid = pid


_DECODER = msgspec.json.Decoder(Manifest)
_ENCODER = msgspec.json.Encoder()


def new_job_id() -> str:
    """A fresh job id."""
    return f"batch_{uuid.uuid4().hex[:24]}"


def load_manifest(paths: JobPaths) -> Manifest:
    """Read the manifest, with a clear message when the directory is not a job or the file is bad."""
    if paths.root.exists() and not paths.root.is_dir():
        raise BatchrunError(f"no job at {paths.root}: it is a file, not a job directory")
    if not paths.root.is_dir():
        raise BatchrunError(f"no job at {paths.root}: the directory does not exist")
    if not paths.manifest.exists():
        # A submit writes the manifest once its input is validated; until then it holds the lock.
        pid = live_holder(paths)
        if pid is not None:
            raise JobValidating(paths.root, pid)
        if paths.journal.exists():
            raise BatchrunError(
                f"the job at {paths.root} has a journal but no {MANIFEST_NAME}; it cannot be "
                "resumed without it (export still writes the journal's results). If a submit "
                "was stopped while validating its input, run that submit again"
            )
        raise BatchrunError(
            f"no job at {paths.root}: there is no {MANIFEST_NAME} (start one with submit)"
        )
    try:
        raw = paths.manifest.read_bytes()
    except OSError as e:
        raise BatchrunError(f"the manifest {paths.manifest} cannot be read: {e}") from e
    try:
        return _DECODER.decode(raw)
    except msgspec.DecodeError as e:
        try:
            data = json.loads(raw)
        except ValueError:
            raise BatchrunError(f"the manifest {paths.manifest} cannot be read: {e}") from e
        if not isinstance(data, dict) or "job_id" not in data:
            raise BatchrunError(f"the manifest {paths.manifest} is not a batchrun manifest") from e
        raise BatchrunError(f"the manifest {paths.manifest} is damaged: {e}") from e


def save_manifest(paths: JobPaths, manifest: Manifest) -> None:
    """Stamp and atomically write the manifest."""
    manifest.updated_at = time.time()
    # Indented: people read manifests (`cat manifest.json`), and it is written a few times a run.
    payload = msgspec.json.format(_ENCODER.encode(manifest), indent=2) + b"\n"
    atomic_write(paths.manifest, lambda f: f.write(payload))


def input_location(paths: JobPaths, path: Path) -> tuple[str, str | None]:
    """The input's place as the manifest keeps it: absolute, and relative to the job directory.

    The relative one lets a job moved together with its input (a project directory renamed)
    find the file again.
    """
    absolute = path.resolve()
    relative = None
    with contextlib.suppress(ValueError):  # no relative path between two drives (Windows)
        relative = os.path.relpath(absolute, paths.root.resolve())
    return str(absolute), relative


def find_input(paths: JobPaths, manifest: Manifest) -> Path | None:
    """The job's input file: at its recorded absolute path, else relative to the job directory."""
    candidates = [Path(manifest.input_path)]
    relative = manifest.input_relpath
    if relative is not None:
        candidates.append(paths.root / relative)
    for candidate in candidates:
        try:
            if candidate.is_file():
                return candidate.resolve()
        except OSError:  # a directory on the way that cannot be entered: not found there
            continue
    return None


def recorded_runner(manifest: Manifest) -> int | None:
    """The pid of the process the manifest says runs the job, if that process is alive.

    Read-only, unlike `lock_holder`: probing the lock takes it for an instant, which could make a
    `resume` starting at that moment think the job runs; export must never disturb a run.
    """
    if manifest.status != "running" or not manifest.runs:
        return None
    pid = manifest.runs[-1].pid
    # Not alive: killed, so the job is interrupted, not running.
    return pid if pid > 0 and process_alive(pid) else None
