"""The job's lock: one process runs a job at a time; the kernel drops it when the holder dies."""

from __future__ import annotations

import errno
import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from batchrun.errors import BatchrunError
from batchrun.job.paths import INPUT_MAP_PREFIX, MANIFEST_NAME, JobPaths
from batchrun.job.vectors import drop_unbacked


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


def live_holder(paths: JobPaths) -> int | None:
    """The pid of the process holding the job's lock, or None; the lock is probed only when the
    pid its file names is alive, so a reader beside a stopped job never takes it, even briefly."""
    pid = _read_pid(paths.lock)
    if pid is None or not process_alive(pid):
        return None
    holder = lock_holder(paths)
    return holder if holder is not None and holder > 0 else None


def process_alive(pid: int) -> bool:
    """Whether process `pid` exists (another user's included)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, another user's
    return True


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
            # Before anything reads the journal to learn what is done: records whose vectors a
            # power cut lost are not done (job/vectors.py), for the replay as for the writer.
            drop_unbacked(paths.journal)
        except OSError as e:
            raise _lock_error(paths, e) from None
        try:
            yield
        finally:
            os.ftruncate(fd, 0)
    finally:
        os.close(fd)
