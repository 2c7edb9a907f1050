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
from typing import NamedTuple

import msgspec

from batchrun.errors import BatchrunError
from batchrun.job.files import fsync_dir, write_all
from batchrun.job.vectors import VectorReader, inline
from batchrun.openai.records import Outcome
from batchrun.openai.vectors import fill_vectors

SHARDS_DIR = "shards"
SHARD_SUFFIX = ".res"
# The environment variable that tells a worker process where to write its shard (the job's
# run sets it; without it, results travel whole).
SHARD_DIR_ENV = "BATCHRUN_SHARD_DIR"
# A Ray actor's node may not see the job directory (or see another one at the same path): the
# parent leaves a token in a file there (`PROBE_NAME`), and an actor writes a shard only where it
# reads the same token back (`seen_shards`); elsewhere its results travel whole.
SHARD_PROBE_ENV = "BATCHRUN_SHARD_PROBE"
PROBE_NAME = ".probe"
# What a shard's name may hold: it becomes a file name, and a journal names it.
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}\Z")


def shards_dir(job_dir: Path) -> Path:
    """Where a job's workers write their shards."""
    return job_dir / SHARDS_DIR


def shard_path(directory: Path, name: str) -> Path:
    """The file of shard `name`; BatchrunError for a name no worker gives (a journal edited by
    hand must not point a reader outside the directory)."""
    if not _NAME.match(name):
        raise BatchrunError(f"a journal record names a result shard {name!r}, which is no name")
    return directory / f"{name}{SHARD_SUFFIX}"


def leave_probe(directory: Path) -> str | None:
    """Make the shards' directory and leave a fresh token in it for Ray actors to read back
    (`seen_shards`); None when the directory cannot be written (results then travel whole)."""
    token = secrets.token_hex(8)
    try:
        directory.mkdir(exist_ok=True)
        (directory / PROBE_NAME).write_text(token)
    except OSError:
        return None
    return token


def seen_shards(env: dict[str, str]) -> Path | None:
    """Where this worker writes its shard, from its environment: the directory, if it is given
    and (a Ray actor's, given a token) it holds the parent's token; None: results travel whole."""
    directory = env.get(SHARD_DIR_ENV)
    if not directory:
        return None
    token = env.get(SHARD_PROBE_ENV)
    if token is not None:
        try:
            if (Path(directory) / PROBE_NAME).read_text() != token:
                return None  # another directory at the same path, on the actor's node
        except (OSError, UnicodeDecodeError):
            return None  # this node does not see the job directory
    return Path(directory)


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
        try:
            self.offset += write_all(fd, pieces)
        except OSError as e:
            raise self._error("write", e) from e

    def sync(self) -> None:
        """Put what was stored on the disk (before anyone is told where it is)."""
        if self._fd is None:
            return
        try:
            os.fsync(self._fd)
        except OSError as e:
            raise self._error("sync", e) from e

    def _error(self, doing: str, e: OSError) -> BatchrunError:
        path = shard_path(self.directory, self.name)
        return BatchrunError(f"cannot {doing} the result shard {path}: {e.strerror or e}")

    def close(self) -> None:
        """Close the file (callers sync first)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


# --- reading results back -----------------------------------------------------------------

# The most shards a reader keeps open (a worker process a shard: a long job whose workers died
# many times has hundreds; export reads them in the order of the input, back and forth).
OPEN_SHARDS = 64

# How a record that names its shard ends: the field is always written last.
_FIELD = b',"shard":["'
_END = b"]}\n"
_DIGITS = frozenset(b"0123456789,")
# Where a shard record's body goes back: its first `"body"` (the fields before it are the
# journal's own and a custom_id, in which a quote is always escaped).
_NULL_BODY = b',"body":null'
_BODY = b',"body":'


class ShardRef(NamedTuple):
    """Where a record's result is: shard `name`, from byte `at`, `body` bytes of JSON and then
    each vector's float32 bytes (`vectors`, their lengths)."""

    name: str
    at: int
    body: int
    vectors: list[int]

    @property
    def size(self) -> int:
        """The bytes of the body and its vectors together."""
        return self.body + sum(self.vectors)


def stored_ref(stored: Sequence[str | int]) -> ShardRef:
    """An outcome's `stored` (`ShardWriter.store`) as a ShardRef."""
    name, at, body, *vectors = stored
    return ShardRef(str(name), int(at), int(body), [int(v) for v in vectors])


def shard_ref(line: bytes) -> ShardRef | None:
    """Where the result of a journal line is; None when the line names no shard (its body is
    in the line, or it has none). BatchrunError for a shard name no worker gives."""
    if not line.endswith(_END):
        return None
    start = line.rfind(_FIELD)
    if start < 0:
        return None
    name, sep, numbers = line[start + len(_FIELD) : -len(_END)].partition(b'",')
    # (Only the record's own last field reaches the line's end in this shape: a body's text is
    # followed by the record's other fields.)
    if not sep or not numbers or not _DIGITS.issuperset(numbers):
        return None
    try:
        at, body, *vectors = map(int, numbers.split(b","))
    except ValueError:  # an empty number (",,"), or one of them only
        return None
    text = name.decode("utf-8", "replace")
    if not _NAME.match(text):
        shard_path(Path(), text)  # raises, naming it
    return ShardRef(text, at, body, vectors)


class ShardReader:
    """Reads results back from a job's shards (up to OPEN_SHARDS files open at once, the
    latest used kept, all of them closed by `close`)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._fds: dict[str, int] = {}

    def _fd(self, name: str) -> int:
        fd = self._fds.pop(name, None)
        if fd is not None:
            self._fds[name] = fd  # the most recently used last
        else:
            if len(self._fds) >= OPEN_SHARDS:
                # A job whose workers died often has as many shards: never run out of files.
                os.close(self._fds.pop(next(iter(self._fds))))
            path = shard_path(self.directory, name)
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError as e:
                raise BatchrunError(
                    f"cannot read the result shard {path}, which holds results the journal "
                    f"names ({e.strerror or e}): it was removed; restore it from a backup"
                ) from None
            self._fds[name] = fd
        return fd

    def read(self, name: str, at: int, size: int) -> bytes:
        """`size` bytes of shard `name` from `at`; BatchrunError when the shard lacks them."""
        fd = self._fd(name)
        data = os.pread(fd, size, at)
        while 0 < len(data) < size:  # (a read may stop short of a large size: go on)
            more = os.pread(fd, size - len(data), at + len(data))
            if not more:
                break
            data += more
        if len(data) != size:
            raise BatchrunError(
                f"the result shard {shard_path(self.directory, name)} ends before the result "
                f"the journal names (byte {at + size}): it was truncated; restore it from a "
                "backup"
            )
        return data

    def load(self, ref: ShardRef) -> tuple[bytes, list[bytes]]:
        """The body's JSON and each vector's float32 bytes at `ref`."""
        data = self.read(ref.name, ref.at, ref.size)
        body, pos = data[: ref.body], ref.body
        vectors = []
        for size in ref.vectors:
            vectors.append(data[pos : pos + size])
            pos += size
        return body, vectors

    def fill(self, outcome: Outcome) -> None:
        """Give an outcome whose worker stored its result (`stored`) its body and vectors back."""
        if outcome.stored is None:
            return
        data, split = self.load(stored_ref(outcome.stored))
        outcome.body = msgspec.Raw(data)
        outcome.vectors = split or None
        outcome.stored = None

    def close(self) -> None:
        """Close every shard opened."""
        fds, self._fds = self._fds, {}
        for fd in fds.values():
            os.close(fd)

    def __enter__(self) -> ShardReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def restore(line: bytes, vectors: VectorReader, shards: ShardReader) -> bytes:
    """A journal line as an earlier version wrote it: a shard's body put back in its place (and
    its vectors as base64), or a side file's vectors (job/vectors.py `inline`); a line that
    names neither is returned as it is."""
    ref = shard_ref(line)
    if ref is None:
        return inline(line, vectors)
    body, split = shards.load(ref)
    if split:
        try:
            body = fill_vectors(body, split)
        except ValueError as e:
            raise BatchrunError(f"a journal record does not match its result shard: {e}") from None
    head = line[: line.rfind(_FIELD)]
    at = head.find(_NULL_BODY)
    if at < 0:
        raise BatchrunError(
            f"a journal record names the result shard {ref.name} but holds a body of its own"
        )
    return b"".join((head[:at], _BODY, body, memoryview(head)[at + len(_NULL_BODY) :], b"}\n"))
