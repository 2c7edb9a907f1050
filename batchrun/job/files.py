"""Atomic file writes: a crash leaves the old file or the new one, never a mix."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

from batchrun.errors import BatchrunError


def atomic_write(path: Path, write: Callable[[IO[bytes]], object], *, advice: str = "") -> None:
    """Write `path` through a temp file in its directory, fsync'd and renamed over it: readers
    (and a crash) see the old file or the new one. `write` fills the file.

    An OSError is a BatchrunError naming `path`, with `advice` (what to do) when given.
    """
    tmp: str | None = None
    try:
        tmp = str(path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"))
        # Not mkstemp: its 0600 mode would make the file unreadable to the user's group; 0666
        # here is narrowed by the umask, like any file the user creates.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with os.fdopen(fd, "wb", buffering=1 << 20) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        tmp = None
        fsync_dir(path.parent)
    except OSError as e:
        message = f"cannot write {path}: {e.strerror or e}"
        raise BatchrunError(f"{message}; {advice}" if advice else message) from e
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write JSON so that a crash leaves either the old file or the new one, never a mix."""
    payload = json.dumps(data, indent=2, ensure_ascii=False).encode("utf-8") + b"\n"
    atomic_write(path, lambda f: f.write(payload))


def fsync_file(path: Path) -> None:
    """Flush one file's data to disk (before a marker or a rename that vouches for it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """Make a rename in `path` durable (where a directory can be opened: not on every platform)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_dirs(path: Path) -> None:
    """Create `path` and its missing parents, each name made durable (its parent directory
    fsync'd): without that a power cut after the directory was made can take it, and all it
    holds, away, however carefully the files in it were synced. OSError as `Path.mkdir` raises."""
    missing = []
    p = path.absolute()
    while not p.exists() and p != p.parent:
        missing.append(p)
        p = p.parent
    path.mkdir(parents=True, exist_ok=True)
    for created in reversed(missing):
        fsync_dir(created.parent)


# The most buffers one writev takes (Linux's IOV_MAX).
_IOV_MAX = 1024


def write_all(fd: int, pieces: Sequence[bytes]) -> int:
    """Append `pieces` to `fd` in one writev for each 1,024 of them, whatever a short write
    leaves; return the bytes written (OSError as it comes).

    writev, not a join: a thousand vectors are 4 MB, which a process's malloc would take as
    fresh pages to fault in and zero (run/memory.py) only to copy them once more.
    """
    pending: list[bytes | memoryview] = list(pieces)
    written = 0
    while pending:
        batch = pending[:_IOV_MAX]
        n = os.writev(fd, batch)
        written += n
        for i, chunk in enumerate(batch):  # drop what was written; keep a partial rest
            if n < len(chunk):
                pending = [memoryview(chunk)[n:], *batch[i + 1 :], *pending[len(batch) :]]
                break
            n -= len(chunk)
        else:
            pending = pending[len(batch) :]
    return written
