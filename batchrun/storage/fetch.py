"""An input URL brought into the job directory: looked up before the job is made, then streamed
once into a file of the job's own, which becomes the job's input only when it is whole.

The copy is written to a temporary name, checked against the size the store reported, fsync'd
and renamed: a download that fails or is interrupted never leaves a file that looks like an
input. A lost connection is read again from where it broke, a bounded number of times with
growing pauses, before it is an error.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from batchrun.errors import BatchrunError
from batchrun.storage.filesystems import READ_ONLY_SCHEMES, cause, open_filesystem, url_scheme

# The job's copy of an input fetched from a URL, in the job directory.
FETCHED_NAME = "input.jsonl"
# Read in blocks of this size (one ranged GET each on S3).
BLOCK = 8 << 20
# A download that breaks is taken up again at most this many times, after pauses of 0.5, 1, 2
# seconds; the filesystem's own client retries each request before that (s3fs, botocore).
RETRIES = 3
FIRST_PAUSE_S = 0.5


def remote_input(text: str) -> str | None:
    """`text` when it is a URL to fetch the input from, None when it is a local path (a file://
    URL included: a local input is read where it is, as always)."""
    scheme = url_scheme(text)
    return None if scheme in (None, "file", "local") else text


def local_path(text: str) -> Path:
    """The local path `text` names (a file:// URL's path)."""
    return Path(text[len("file://") :]) if text.startswith("file://") else Path(text)


@dataclass(frozen=True)
class Fetched:
    """An input brought into the job directory: where, how large, its sha256."""

    path: Path
    size: int
    sha256: str


def check_remote_input(url: str) -> int:
    """Check that `url` names an object that can be read; returns its size.

    Raises BatchrunError (one line naming the URL and the cause) for a missing bucket or key,
    denied credentials, an endpoint that does not answer, or a scheme with no filesystem.
    """
    fs, path = open_filesystem(url)
    try:
        info = fs.info(path)
    except Exception as e:  # each backend raises its own kinds; all are said the same way
        raise BatchrunError(f"cannot read {url}: {cause(e)}") from None
    if info.get("type") == "directory":
        raise BatchrunError(f"cannot read {url}: it is a directory (a prefix), not an object")
    size = info.get("size")
    if size == 0:
        raise BatchrunError(f"input file is empty: {url}")
    return int(size) if size is not None else -1


def fetch_input(url: str, job_dir: Path) -> Fetched:
    """Stream `url` into the job directory (as FETCHED_NAME), hashing it as it comes.

    Raises BatchrunError when it cannot be read whole; then nothing is left in `job_dir`.
    """
    size = check_remote_input(url)
    dest = job_dir / FETCHED_NAME
    partial = job_dir / f".{FETCHED_NAME}.part"
    try:
        with partial.open("wb") as out:
            done, digest = _stream(url, out)
            if size >= 0 and done != size:
                raise BatchrunError(
                    f"cannot read {url}: the download ended after {done:,} of {size:,} bytes; "
                    "no job was made"
                )
            out.flush()
            os.fsync(out.fileno())
        os.replace(partial, dest)
    except OSError as e:  # the job directory's own disk: full, or not writable
        raise BatchrunError(f"cannot write {dest}: {e.strerror or e}") from None
    finally:
        with contextlib.suppress(OSError):
            partial.unlink()
    return Fetched(dest, done, digest)


def _stream(url: str, out: BinaryIO) -> tuple[int, str]:
    """Copy `url` into `out` block by block; returns the bytes copied and their sha256.

    A read that fails opens the object again, up to RETRIES times in all: at the offset reached
    where the store serves ranges (object stores), from the start where it need not (an HTTP
    server). An error writing `out` (the local disk) is not the store's and is raised as it is.
    """
    fs, path = open_filesystem(url)
    ranged = url_scheme(url) not in READ_ONLY_SCHEMES
    # An HTTP server need not serve ranges (Python's own does not): read it as one stream.
    options: dict[str, Any] = (
        {"block_size": BLOCK, "cache_type": "none"} if ranged else {"block_size": 0}
    )
    digest = hashlib.sha256()
    src: BinaryIO | None = None
    done = failures = 0
    try:
        while True:
            if src is None and done and not ranged:  # starting over
                out.seek(0)
                out.truncate()
                digest, done = hashlib.sha256(), 0
            try:
                if src is None:
                    src = fs.open(path, "rb", **options)
                    if done:
                        src.seek(done)
                block = src.read(BLOCK)
            except Exception as e:  # each backend raises its own kinds
                _close(src)
                src = None
                if not _transient(e) or failures >= RETRIES:
                    tried = f" (read {failures + 1} times)" if failures else ""
                    raise BatchrunError(
                        f"cannot read {url}: {cause(e)}{tried}; no job was made"
                    ) from None
                time.sleep(FIRST_PAUSE_S * 2**failures)
                failures += 1
                continue
            if not block:
                return done, digest.hexdigest()
            out.write(block)
            digest.update(block)
            done += len(block)
    finally:
        _close(src)


def _close(src: BinaryIO | None) -> None:
    """Close a source whose connection may already be broken."""
    if src is not None:
        with contextlib.suppress(Exception):
            src.close()


def _transient(error: BaseException) -> bool:
    """Whether reading again may help: not for a missing object, a refusal, or no credentials,
    nor for an object that changed while it was read (its ETag no longer matches)."""
    names = {cls.__name__ for cls in type(error).__mro__}
    if names & {"NoCredentialsError", "PartialCredentialsError", "FileExpired"}:
        return False
    return not isinstance(error, (FileNotFoundError, PermissionError, IsADirectoryError))
