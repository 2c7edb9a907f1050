"""The job directory: an atomically written manifest, the journal, a lock, and state derived from it."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from batchrun.errors import BatchrunError
from batchrun.journal import JOURNAL_NAME, read_records

MANIFEST_NAME = "manifest.json"
LOCK_NAME = "lock"
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
    fd = os.open(paths.lock, os.O_RDWR | os.O_CREAT, 0o644)
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
            raise
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        # Holding the lock, no one else writes here: a temporary manifest left is a killed
        # write's, never read (the rename had not happened), and can go.
        for stale in paths.root.glob(f".{MANIFEST_NAME}.*.tmp"):
            stale.unlink(missing_ok=True)
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

    def record(self, rec: dict[str, Any]) -> None:
        """Fold one journal record into the state."""
        t = rec.get("time")
        if isinstance(t, (int, float)):
            self.first_time = t if self.first_time is None else min(self.first_time, t)
            self.last_time = t if self.last_time is None else max(self.last_time, t)
        if rec.get("kind") == "invalid":
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


def replay(paths: JobPaths) -> JobState:
    """Derive the job's state from its journal (the one source of truth)."""
    state = JobState()
    for rec in read_records(paths.journal):
        state.record(rec)
    return state
