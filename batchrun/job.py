"""The job directory: an atomically written manifest, the journal, a lock, and state derived from it."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import time
import uuid
from collections.abc import Container, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from batchrun.errors import BatchrunError
from batchrun.journal import JOURNAL_NAME, read_records
from batchrun.records import Request
from batchrun.text import command

MANIFEST_NAME = "manifest.json"
LOCK_NAME = "lock"
# input-map-<generation>.jsonl: the input file as a forced resume found it (see InputMap).
INPUT_MAP_PREFIX = "input-map-"
FORMAT_VERSION = 1

# A request's state, derived from its last journal record.
OK, FAILED_RETRYABLE, FAILED_FINAL = 0, 1, 2


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write JSON so that a crash leaves either the old file or the new one, never a mix."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    payload = json.dumps(data, indent=2, ensure_ascii=False).encode("utf-8") + b"\n"
    try:
        with open(tmp, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise BatchrunError(f"cannot write {path}: {e.strerror or e}") from e


def fsync_dir(path: Path) -> None:
    """Make a rename in `path` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass
class JobPaths:
    """Where a job keeps its files."""

    root: Path

    @property
    def logs(self) -> Path:
        """Where each engine worker's own output goes (logs/worker-N.log)."""
        return self.root / "logs"

    @property
    def manifest(self) -> Path:
        """The manifest file."""
        return self.root / MANIFEST_NAME

    @property
    def journal(self) -> Path:
        """The journal file."""
        return self.root / JOURNAL_NAME

    @property
    def lock(self) -> Path:
        """The lock file (holds the running process's id)."""
        return self.root / LOCK_NAME


def new_job_id() -> str:
    """A fresh job id."""
    return f"batch_{uuid.uuid4().hex[:24]}"


def load_manifest(paths: JobPaths) -> dict[str, Any]:
    """Read the manifest, with a clear message when the directory is not a job or the file is bad."""
    if paths.root.exists() and not paths.root.is_dir():
        raise BatchrunError(f"no job at {paths.root}: it is a file, not a job directory")
    if not paths.root.is_dir():
        raise BatchrunError(f"no job at {paths.root}: the directory does not exist")
    if not paths.manifest.exists():
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
        data = json.loads(paths.manifest.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise BatchrunError(f"the manifest {paths.manifest} cannot be read: {e}") from e
    if not isinstance(data, dict) or "job_id" not in data:
        raise BatchrunError(f"the manifest {paths.manifest} is not a batchrun manifest")
    return data


def save_manifest(paths: JobPaths, manifest: dict[str, Any]) -> None:
    """Stamp and atomically write the manifest."""
    manifest["updated_at"] = time.time()
    write_json_atomic(paths.manifest, manifest)


# --- where the input is, and what it holds now --------------------------------------------------


def input_location(paths: JobPaths, path: Path) -> dict[str, str]:
    """The manifest's fields for the input's place: absolute, and relative to the job directory.

    The relative one lets a job moved together with its input (a project directory renamed)
    find the file again.
    """
    absolute = path.resolve()
    location = {"input_path": str(absolute)}
    with contextlib.suppress(ValueError):  # no relative path between two drives (Windows)
        location["input_relpath"] = os.path.relpath(absolute, paths.root.resolve())
    return location


def find_input(paths: JobPaths, manifest: dict[str, Any]) -> Path | None:
    """The job's input file: at its recorded absolute path, else relative to the job directory."""
    candidates = [Path(manifest["input_path"])]
    relative = manifest.get("input_relpath")
    if isinstance(relative, str):
        candidates.append(paths.root / relative)
    for candidate in candidates:
        try:
            if candidate.is_file():
                return candidate.resolve()
        except OSError:  # a directory on the way that cannot be entered: not found there
            continue
    return None


@dataclass(frozen=True)
class InputMap:
    """The input file as the last forced resume read it: each valid request's line number.

    A job whose input never changed has none (the journal's line numbers are the file's). After
    `resume --force`, requests whose custom_id left the file are no longer part of the job, and
    a finished request's line is where it is now, not where it was when it ran. `generation`
    tags the invalid-line records of that reading in the journal; older ones are another file's.
    """

    generation: str
    lines: dict[str, int]


def write_input_map(paths: JobPaths, generation: str, requests: Iterable[tuple[str, int]]) -> str:
    """Atomically write the input map of `generation` (custom_id, line pairs); return its name.

    One `[custom_id, line]` JSON array a line, streamed: a million requests never sit in memory.
    """
    name = f"{INPUT_MAP_PREFIX}{generation}.jsonl"
    path = paths.root / name
    tmp = paths.root / f".{name}.{os.getpid()}.tmp"
    done = False
    try:
        with open(tmp, "wb", buffering=1 << 20) as f:
            for custom_id, line in requests:
                f.write(json.dumps([custom_id, line], ensure_ascii=False).encode("utf-8") + b"\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        done = True
        fsync_dir(paths.root)
    except OSError as e:
        raise BatchrunError(f"cannot write {path}: {e.strerror or e}") from e
    finally:
        if not done:
            tmp.unlink(missing_ok=True)
    return name


def load_input_map(paths: JobPaths, manifest: dict[str, Any]) -> InputMap | None:
    """The job's input map, or None when its input never changed (no forced resume)."""
    info = manifest.get("input_map")
    if not isinstance(info, dict):
        return None
    path = paths.root / str(info.get("file"))
    lines: dict[str, int] = {}
    try:
        with path.open("rb") as f:
            for raw in f:
                custom_id, line = json.loads(raw)
                lines[str(custom_id)] = int(line)
    except OSError as e:
        raise BatchrunError(
            f"cannot read the job's input map {path}: {e.strerror or e}; "
            f"`{command('resume', paths.root, '--force')}` writes it again"
        ) from e
    except (ValueError, TypeError):
        raise BatchrunError(
            f"the job's input map {path} is corrupt; "
            f"`{command('resume', paths.root, '--force')}` writes it again"
        ) from None
    return InputMap(str(info.get("generation")), lines)


def recorded_runner(manifest: dict[str, Any]) -> int | None:
    """The pid of the process the manifest says runs the job, if that process is alive.

    Read-only, unlike `lock_holder`: probing the lock takes it for an instant, which could make a
    `resume` starting at that moment think the job runs; export must never disturb a run.
    """
    runs = manifest.get("runs") or []
    if manifest.get("status") != "running" or not runs or not isinstance(runs[-1], dict):
        return None
    pid = runs[-1].get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None  # killed: the job is interrupted, not running
    except PermissionError:
        pass  # alive, another user's
    return pid


def lock_holder(paths: JobPaths) -> int | None:
    """The pid of the process running this job, or None when no process holds the lock."""
    if not paths.lock.exists():
        return None
    try:
        fd = os.open(paths.lock, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return _read_pid(paths.lock) or -1
            raise
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _write_pid(fd: int) -> None:
    """Put the holder's pid into the lock file, for the "already running in process N" message."""
    os.write(fd, f"{os.getpid()}\n".encode())


def _lock_error(paths: JobPaths, e: OSError) -> BatchrunError:
    """The one-line message for a lock that cannot be taken: a read-only or full job directory."""
    return BatchrunError(
        f"cannot write the job's lock file {paths.lock}: {e.strerror or e} (running a job needs "
        "a writable job directory; export can write elsewhere with --output-dir)"
    )


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip() or 0) or None
    except (OSError, ValueError):
        return None


@contextmanager
def job_lock(paths: JobPaths) -> Iterator[None]:
    """Hold the job's lock for the duration; refuse at once if another process holds it.

    flock is released by the kernel when the holder dies, so a lock left by a killed process is
    never stale: the next run simply takes it.
    """
    try:
        fd = os.open(paths.lock, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise _lock_error(paths, e) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                pid = _read_pid(paths.lock)
                who = f"process {pid}" if pid else "another process"
                raise BatchrunError(
                    f"the job at {paths.root} is already running in {who}; "
                    "wait for it to finish or stop it first"
                ) from None
            raise _lock_error(paths, e) from None
        try:
            os.ftruncate(fd, 0)
            _write_pid(fd)
            # Holding the lock, no one else writes here: a temporary file left is a killed
            # write's, never read (the rename had not happened), and can go.
            for pattern in (f".{MANIFEST_NAME}.*.tmp", f".{INPUT_MAP_PREFIX}*.tmp"):
                for stale in paths.root.glob(pattern):
                    stale.unlink(missing_ok=True)
        except OSError as e:
            raise _lock_error(paths, e) from None
        try:
            yield
        finally:
            os.ftruncate(fd, 0)
    finally:
        os.close(fd)


@dataclass
class JobState:
    """What the journal says: per request, attempts and how the last one ended; totals."""

    attempts: dict[str, int] = field(default_factory=dict)
    last: dict[str, int] = field(default_factory=dict)
    invalid: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    first_time: float | None = None
    last_time: float | None = None
    # Per worker index: [attempts, completion tokens, first time, last time].
    per_worker: dict[str, list[float]] = field(default_factory=dict)
    # After a forced resume (see InputMap): only these custom_ids are part of the job, and only
    # invalid-line records tagged with this generation are the current file's.
    current: Container[str] | None = None
    generation: str | None = None

    @property
    def succeeded(self) -> int:
        """Requests whose last attempt succeeded."""
        return sum(1 for v in self.last.values() if v == OK)

    @property
    def failed(self) -> int:
        """Requests whose last attempt failed."""
        return sum(1 for v in self.last.values() if v != OK)

    def is_done(self, custom_id: str) -> bool:
        """Whether the request has any finished attempt."""
        return custom_id in self.last

    def is_not_done(self, request: Request) -> bool:
        """Whether the request still waits for its first finished attempt."""
        return request.custom_id not in self.last

    def record(self, rec: dict[str, Any]) -> None:
        """Fold one journal record into the state."""
        invalid = rec.get("kind") == "invalid"
        if invalid:
            # Untagged records are submit's; tagged ones a forced resume's (of `generation` only).
            if rec.get("generation") != self.generation:
                return
        elif self.current is not None and rec["custom_id"] not in self.current:
            return  # its line left the input file: no longer part of the job
        t = rec.get("time")
        if isinstance(t, (int, float)):
            self.first_time = t if self.first_time is None else min(self.first_time, t)
            self.last_time = t if self.last_time is None else max(self.last_time, t)
        if invalid:
            self.invalid += 1
            return
        cid = rec["custom_id"]
        self.attempts[cid] = self.attempts.get(cid, 0) + 1
        if rec.get("ok"):
            self.last[cid] = OK
        else:
            self.last[cid] = FAILED_RETRYABLE if rec.get("retryable") else FAILED_FINAL
        self.prompt_tokens += int(rec.get("prompt_tokens") or 0)
        tokens = int(rec.get("completion_tokens") or 0)
        self.completion_tokens += tokens
        worker = rec.get("worker")
        if worker is not None and isinstance(t, (int, float)):
            stats = self.per_worker.get(str(worker))
            if stats is None:
                self.per_worker[str(worker)] = [1, tokens, t, t]
            else:
                stats[0] += 1
                stats[1] += tokens
                stats[2] = min(stats[2], t)
                stats[3] = max(stats[3], t)


def replay(paths: JobPaths, manifest: dict[str, Any] | None = None) -> JobState:
    """Derive the job's state from its journal (the one source of truth).

    With the manifest, of the input file as it is now: after a forced resume, requests that left
    the file and the old file's invalid lines are not counted (see InputMap).
    """
    input_map = load_input_map(paths, manifest) if manifest is not None else None
    state = JobState()
    if input_map is not None:
        state.current, state.generation = input_map.lines, input_map.generation
    for rec in read_records(paths.journal):
        state.record(rec)
    return state
