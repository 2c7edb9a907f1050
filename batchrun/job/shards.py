"""Result shards: each worker writes the bodies (and vectors) of its results itself.

A worker process of a job's run appends each successful result's body to a file of its own in
the job directory, `shards/<name>.res` (one file per worker process: a restarted worker starts a
new one), fsyncs it, and only then sends the parent the outcome without its body: what the
parent needs to schedule, count and journal (custom_id, ok, status, error, token counts,
latency) and where the body is. The parent's journal record of that attempt is the usual one
with `"body": null` and, its last field, ``"shard": [name, at, body_bytes, v1, v2, ...]``: the
shard's name, the offset of the body's JSON there, its length, and (an embeddings body) the
length of each of its vectors' float32 bytes, which follow the body in the shard. The body's
JSON is the one the journal would have held (its embeddings emptied, as job/vectors.py's side
file has them), so `restore` gives back, byte for byte, the line an earlier version journaled.

Why it is crash-safe: the journal stays the one ordered log of finished attempts, and the shard
bytes a record names were on the disk before the parent heard of them. Bytes no record names (a
worker killed before its message arrived, a result the parent set aside as stale, a torn tail)
are never read: a request counts as done only by its journal record, exactly as before. A power
cut cannot leave a record whose body is missing, since its shard was fsync'd first.

Where results still travel to the parent whole: serve's engine pool (one worker runs many jobs'
requests), Ray actors (their node may not see the job directory), a body UTF-8 cannot hold, and
failures (no body). A journal of an earlier version names no shard and reads as it always did.
"""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from batchrun.errors import BatchrunError
from batchrun.job.files import fsync_dir
from batchrun.openai.records import Outcome

SHARDS_DIR = "shards"
SHARD_SUFFIX = ".res"
# The environment variable that tells a worker process where to write its shard (the job's
# run sets it; without it, results travel whole).
SHARD_DIR_ENV = "BATCHRUN_SHARD_DIR"
# What a shard's name may hold: it becomes a file name, and a journal names it.
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}\Z")
# The most buffers one writev takes (Linux's IOV_MAX).
_IOV_MAX = 1024


def shards_dir(job_dir: Path) -> Path:
    """Where a job's workers write their shards."""
    return job_dir / SHARDS_DIR


def shard_path(directory: Path, name: str) -> Path:
    """The file of shard `name`; BatchrunError for a name no worker gives (a journal edited by
    hand must not point a reader outside the directory)."""
    if not _NAME.match(name):
        raise BatchrunError(f"a journal record names a result shard {name!r}, which is no name")
    return directory / f"{name}{SHARD_SUFFIX}"


def new_shard_name(worker: str) -> str:
    """A fresh name for a worker process's shard: its worker's index and a random part (a
    restarted worker, or a pid used again after a reboot, never appends to another's file)."""
    tag = re.sub(r"[^A-Za-z0-9]", "", worker)[:16] or "x"
    return f"w{tag}-{secrets.token_hex(6)}"


@dataclass
class ShardWriter:
    """A worker's shard: appends the bodies of its outcomes, which then travel without them."""

    directory: Path
    name: str
    _fd: int | None = field(default=None, init=False)
    offset: int = field(default=0, init=False)

    def _open(self) -> int:
        try:
            self.directory.mkdir(exist_ok=True)
            path = shard_path(self.directory, self.name)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)
            # Its name durable before a synced journal record names it.
            fsync_dir(self.directory)
            fsync_dir(self.directory.parent)
        except OSError as e:
            raise BatchrunError(
                f"cannot write the result shard in {self.directory}: {e.strerror or e}"
            ) from e
        self.offset = os.fstat(fd).st_size
        self._fd = fd
        return fd

    def store(self, outcomes: Sequence[Outcome]) -> int:
        """Append the pre-encoded bodies (and vectors) of `outcomes`, in one system call for
        each 1,024 pieces; each such outcome then names its place (`stored`) instead of holding
        them. Returns how many were stored. Nothing is on the disk until `sync`."""
        pieces: list[bytes] = []
        at = self.offset
        stored = 0
        for outcome in outcomes:
            body = outcome.body
            if type(body) is not msgspec.Raw:
                continue  # no body, or one UTF-8 cannot hold: it travels whole
            data = bytes(body)
            vectors = outcome.vectors or ()
            ref: list[str | int] = [self.name, at, len(data)]
            pieces.append(data)
            at += len(data)
            for vector in vectors:
                ref.append(len(vector))
                pieces.append(vector)
                at += len(vector)
            outcome.stored = ref
            outcome.body = None
            outcome.vectors = None
            stored += 1
        if pieces:
            self._write(pieces)
        return stored

    def _write(self, pieces: list[bytes]) -> None:
        fd = self._fd if self._fd is not None else self._open()
        pending: list[bytes | memoryview] = list(pieces)
        try:
            while pending:
                batch = pending[:_IOV_MAX]
                n = os.writev(fd, batch)
                self.offset += n
                for i, chunk in enumerate(batch):  # drop what was written; keep a partial rest
                    if n < len(chunk):
                        pending = [memoryview(chunk)[n:], *batch[i + 1 :], *pending[len(batch) :]]
                        break
                    n -= len(chunk)
                else:
                    pending = pending[len(batch) :]
        except OSError as e:
            raise BatchrunError(
                f"cannot write the result shard {shard_path(self.directory, self.name)}: "
                f"{e.strerror or e}"
            ) from e

    def sync(self) -> None:
        """Put what was stored on the disk (before anyone is told where it is)."""
        if self._fd is None:
            return
        try:
            os.fsync(self._fd)
        except OSError as e:
            raise BatchrunError(
                f"cannot sync the result shard {shard_path(self.directory, self.name)}: "
                f"{e.strerror or e}"
            ) from e

    def close(self) -> None:
        """Close the file (callers sync first)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class ShardReader:
    """TEMPORARY stand-in until the reader lands (helper)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._fds: dict[str, int] = {}

    def read(self, name: str, at: int, size: int) -> bytes:
        """`size` bytes at `at` of shard `name`."""
        fd = self._fds.get(name)
        if fd is None:
            fd = self._fds[name] = os.open(shard_path(self.directory, name), os.O_RDONLY)
        return os.pread(fd, size, at)

    def fill(self, outcome: Outcome) -> None:
        """Read `outcome`'s body and vectors back from its shard."""
        ref = outcome.stored
        assert ref is not None
        name, at, size, *sizes = ref
        assert isinstance(name, str) and isinstance(at, int) and isinstance(size, int)
        data = self.read(name, at, size + sum(int(s) for s in sizes))
        outcome.body = msgspec.Raw(data[:size])
        vectors, pos = [], size
        for s in sizes:
            vectors.append(data[pos : pos + int(s)])
            pos += int(s)
        outcome.vectors = vectors or None
        outcome.stored = None
