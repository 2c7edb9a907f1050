"""The append-only journal: the job's checkpoint, one JSON line per finished attempt.

Each record is written to the file as soon as it arrives (so a killed process loses nothing the
kernel already has) and fsync'd by a background thread within about a second (so a power cut
loses at most that); closing fsyncs the rest. On open, a torn last line left by a crash
mid-write is cut off.

Record shapes (one JSON object a line; typed in batchrun.job.journal_records):

- ``{"kind": "result", "custom_id", "line", "attempt", "ok", "status_code", "body", "error",
  "retryable", "prompt_tokens", "completion_tokens", "latency_s", "time"}``: one attempt.
- ``{"kind": "invalid", "custom_id", "line", "error", "time"}``: an input line that failed
  validation (``custom_id`` is null when none could be read). A forced resume's reading of a
  changed input adds ``"generation"``, its input map's (see job.InputMap).

An embeddings result whose worker split its vectors out (openai/vectors.py) keeps them in the
side file `journal.f32`, as float32 bytes, and its record ends with ``"vectors": [at, n1, ...]``
(job/vectors.py: `inline` gives the line with its base64 back, as earlier versions wrote it).
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Protocol

import msgspec

from batchrun.errors import BatchrunError
from batchrun.job.files import fsync_dir
from batchrun.job.journal_records import InvalidRecord as InvalidRecord
from batchrun.job.journal_records import ResultRecord as ResultRecord
from batchrun.job.journal_records import invalid_record as invalid_record
from batchrun.job.journal_records import result_record as result_record
from batchrun.job.vectors import VectorWriter, drop_unbacked, vectors_path
from batchrun.openai.records import Outcome

JOURNAL_NAME = "journal.jsonl"
# About the most bytes of records one write of `JournalWriter.append` takes (see there), and what
# a record holds besides a pre-encoded body, as that estimate counts it.
WRITE_BYTES = 96 * 1024
_RECORD_BYTES = 400

# The fast encoder: msgspec writes compact JSON in UTF-8, with the same bytes as the json encoders
# below for everything but some floats (see `_may_differ`) and NaN/Infinity (null, where json
# writes the non-JSON NaN and Infinity).
_FAST = msgspec.json.Encoder()


def _raw_value(obj: Any) -> Any:
    """For json: a pre-encoded value (a worker's response body, see `encode_body`), decoded."""
    if isinstance(obj, msgspec.Raw):
        return json.loads(bytes(obj))
    raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")


# The exact encoders, for what msgspec may write differently, and built once (json.dumps with
# options builds a new encoder on every call).
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=_raw_value)
# For the rare record that UTF-8 cannot hold (a lone surrogate in a model's text, an error
# message or an old journal's custom_id): every non-ASCII character becomes a \uXXXX escape,
# which is still valid JSON and reads back as the same string.
_ASCII_ENCODER = json.JSONEncoder(ensure_ascii=True, separators=(",", ":"), default=_raw_value)

# Digits to 0, and what can end a number in a document to a comma (see `_may_differ`).
_NUMBER_SHAPES = bytes.maketrans(b"123456789]}\n", b"000000000,,,")


def _may_differ(data: bytes) -> bool:
    """Whether msgspec may have written a number of `data` (a JSON object, or lines of them)
    other than json does: json's float repr switches to an exponent below 1e-4 and from 1e16
    (`1e-05`, `1e+16`), msgspec's later and without the padding (`0.00001`, `1e-7`, `1e16`).
    Every such number holds "0.0000" or, digits read as 0, "0e-", "0e00," or "0e000,"; text
    may too (the price is only the slow path)."""
    if b"0.0000" in data:
        return True
    shapes = data.translate(_NUMBER_SHAPES)
    return b"0e-" in shapes or b"0e00," in shapes or b"0e000," in shapes


def _encode_exact(record: Any) -> bytes:
    try:
        return _ENCODER.encode(record).encode("utf-8") + b"\n"
    except UnicodeEncodeError:
        # Nothing a record holds may stop the journal: a result is lost otherwise, and with it
        # possibly the job.
        return _ASCII_ENCODER.encode(record).encode("ascii") + b"\n"


def encode_record(record: Mapping[str, Any]) -> bytes:
    """One journal line: the record as compact JSON in UTF-8, with its newline.

    The bytes are json's (`ensure_ascii=False`, compact separators), written by msgspec when that
    gives the same; a record UTF-8 cannot hold is written with \\u escapes.
    """
    try:
        data = _FAST.encode(record)
    except Exception:  # a lone surrogate; a type only json takes (or neither: json says so)
        return _encode_exact(record)
    if _may_differ(data):
        return _encode_exact(record)
    return data + b"\n"


def encode_records(records: Sequence[Mapping[str, Any]], *, plain: bool = False) -> bytes:
    """Journal lines for `records`, as `encode_record` writes each, in one go.

    `plain`: the caller vouches that every float in the records is one msgspec writes as json
    does (0, or between 1e-4 and 1e16 in size; pre-encoded bodies are checked by `encode_body`),
    which saves the scan for the others.
    """
    try:
        data = _FAST.encode_lines(records)
    except Exception:
        return b"".join(map(encode_record, records))
    if not plain and _may_differ(data):
        return b"".join(map(encode_record, records))
    return data


def plain_float(value: float) -> bool:
    """Whether msgspec writes `value` as json does (see `encode_records`)."""
    return value == 0 or 1e-4 <= abs(value) < 1e16


def exact_float(value: float) -> float | msgspec.Raw:
    """`value`, or, where msgspec would write it other than json does, json's bytes for it: a
    record that holds it is `plain` (see `encode_records`)."""
    if plain_float(value):
        return value
    # json writes a finite float as its repr (NaN and infinities by name).
    return msgspec.Raw(repr(value) if math.isfinite(value) else _ENCODER.encode(value))


def encode_body(body: dict[str, Any], *, floats: bool = True) -> dict[str, Any] | msgspec.Raw:
    """A response body as its JSON, exactly as the journal writes it, for a worker to send
    instead of the object: the parent writes those bytes as they are (no pickling of the object
    on the way, no encoding in the one process every result goes through).

    `floats=False`: the caller knows the body holds none, which saves checking how they were
    written. A body UTF-8 cannot hold (a lone surrogate) stays an object: its journal line is
    written with escapes, all of it.
    """
    try:
        data = _FAST.encode(body)
    except Exception:
        return body
    if floats and _may_differ(data):
        try:
            data = _ENCODER.encode(body).encode("utf-8")
        except Exception:
            return body
    return msgspec.Raw(data)


def plain_result(outcome: Outcome) -> bool:
    """Whether the result record of `outcome` holds no float msgspec may write other than json
    does (see `encode_records`), its latency aside (see `exact_float`): its body pre-encoded (or
    none), its error text, its token counts integers."""
    body, error = outcome.body, outcome.error
    return (
        (body is None or type(body) is msgspec.Raw)
        and (error is None or all(type(v) is str for v in error.values()))
        and type(outcome.prompt_tokens) is int
        and type(outcome.completion_tokens) is int
    )


def repair_tail(path: Path) -> int:
    """Cut a torn last line (no trailing newline) off the journal; return the bytes dropped."""
    if not path.exists():
        return 0
    with path.open("r+b") as f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return 0
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return 0
        # Walk back in blocks to the last newline: the torn line may be long.
        pos = size
        keep = 0
        block = 1 << 16
        while pos > 0:
            start = max(0, pos - block)
            f.seek(start)
            chunk = f.read(pos - start)
            idx = chunk.rfind(b"\n")
            if idx >= 0:
                keep = start + idx + 1
                break
            pos = start
        f.truncate(keep)
        f.flush()
        os.fsync(f.fileno())
        return size - keep


def read_records(
    path: Path, *, strict: bool = True, end: int | None = None
) -> Iterator[dict[str, Any]]:
    """Yield the journal's records in order (those whose lines end by byte `end`, when given).

    A line that is not a JSON object is a corrupt journal: with `strict`, that raises a
    BatchrunError naming the line; otherwise the line is skipped. A torn final line (no newline)
    is ignored here; `repair_tail` removes it for good when a writer opens the journal.
    """
    if not path.exists():
        return
    with path.open("rb") as f:
        pos = 0
        for lineno, raw in enumerate(f, start=1):
            if not raw.endswith(b"\n"):
                return
            pos += len(raw)
            if end is not None and pos > end:
                return
            try:
                rec = json.loads(raw)
            except ValueError:
                rec = None
            if not isinstance(rec, dict) or "kind" not in rec:
                if strict:
                    raise BatchrunError(
                        f"the journal {path} is corrupt at line {lineno}; "
                        "move that line out of the file (or restore a backup) and run again"
                    )
                continue
            yield rec


class JournalWatcher(Protocol):
    """Told of each write to the journal (the job's summary keeper, job/summary.py)."""

    def written(self, offset: int, data: bytes) -> None:
        """`data` was written; the journal now ends at `offset`."""
        ...

    def closed(self, offset: int) -> None:
        """The journal, ending at `offset`, was synced and is about to close."""
        ...


@dataclass
class JournalWriter:
    """Appends records to the journal: each written at once, fsync'd in the background.

    Every append reaches the kernel before it returns (a killed process loses nothing), in one
    system call. fsync, which only a power cut needs, runs in a thread of its own (it releases the
    GIL): `interval_s` after the first write it has not covered, or at once when `group` records
    wait. A power cut loses at most that: about `interval_s` of results, or `group` records.
    `sync` and `close` fsync everything written before they return.
    """

    path: Path
    group: int = 1 << 16
    interval_s: float = 1.0
    _f: BinaryIO | None = field(default=None, init=False)
    # Written and not yet covered by an fsync (one in flight covers what was written before it).
    _unsynced: int = field(default=0, init=False)
    # A background fsync under way: what it covers is not on the disk until it returns.
    _syncing: bool = field(default=False, init=False)
    _dirty_since: float | None = field(default=None, init=False)
    _urgent: bool = field(default=False, init=False)
    _closing: bool = field(default=False, init=False)
    _error: OSError | None = field(default=None, init=False)
    _cond: threading.Condition = field(default_factory=threading.Condition, init=False)
    _syncer: threading.Thread | None = field(default=None, init=False)
    # Where the journal ends: its size at open plus every byte written since.
    offset: int = field(default=0, init=False)
    # Told of each write and of the close (None: nobody watches).
    watcher: JournalWatcher | None = field(default=None, init=False)
    # The side file of the vectors (job/vectors.py), opened by the first record that has some.
    _vectors: VectorWriter | None = field(default=None, init=False)

    def open(self) -> JournalWriter:
        """Repair a torn tail and open for appending."""
        try:
            repair_tail(self.path)
            drop_unbacked(self.path)
            created = not self.path.exists()
            # buffering=0: every write() reaches the kernel, so a killed process loses nothing.
            self._f = open(self.path, "ab", buffering=0)  # noqa: SIM115
            if created:
                # The journal's name durable before anything in it is: an fsync of the file
                # alone does not keep a new file's name through a power cut.
                fsync_dir(self.path.parent)
            self.offset = os.fstat(self._f.fileno()).st_size
        except OSError as e:  # a read-only or full job directory: one line, not a traceback
            raise BatchrunError(f"cannot open the journal {self.path}: {e.strerror or e}") from e
        self._closing = False
        return self

    def append(self, records: Iterable[Mapping[str, Any]], *, plain: bool = False) -> None:
        """Write records, in order, in one system call for each WRITE_BYTES of them or so; the
        background thread fsyncs them soon.

        Why not one call for all: the parent's malloc gives every block past 128 KiB fresh pages
        (run/memory.py), faulted in and zeroed by the kernel, and an append of a thousand
        embeddings is 6 MB. A kill between two writes leaves whole records: a request's record,
        or none (a deduplicated copy follows its representative, so at worst the copy runs again).
        `plain`: see `encode_records`.

        A record whose `vectors` are float32 bytes (a worker split them out of its body) has
        them appended to the side file first, in one system call for the call's records, and
        the field made their place there (`[at, n1, ...]`, moved last: job/vectors.py).
        """
        assert self._f is not None, "journal not open"
        if not isinstance(records, Sequence):
            records = list(records)
        if not records:
            return
        self._place_vectors(records)
        start, size = 0, 0
        for i, rec in enumerate(records):
            body = rec.get("body")
            # A pre-encoded body is most of a large record; the rest is a few hundred bytes.
            n = (len(body) if type(body) is msgspec.Raw else 0) + _RECORD_BYTES
            if size + n > WRITE_BYTES and i > start:
                self._write(encode_records(records[start:i], plain=plain), i - start)
                start, size = i, 0
            size += n
        self._write(encode_records(records[start:], plain=plain), len(records) - start)

    def _place_vectors(self, records: Sequence[Mapping[str, Any]]) -> None:
        """Write the records' vectors to the side file; each record's field becomes where."""
        # (Bytes: not placed yet; a record appended again names its place already.)
        held = [rec for rec in records if "vectors" in rec and type(rec["vectors"][0]) is bytes]
        if not held:
            return
        if self._vectors is None:
            self._vectors = VectorWriter(vectors_path(self.path))
        chunks = [v for rec in held for v in rec["vectors"]]
        at = self._vectors.write(chunks)
        for rec in held:
            vectors = rec.pop("vectors")  # type: ignore[attr-defined]
            sizes = [len(v) for v in vectors]
            rec["vectors"] = [at, *sizes]  # type: ignore[index]
            at += sum(sizes)

    def _write(self, data: bytes, count: int) -> None:
        """Write `count` encoded journal lines in one system call."""
        assert self._f is not None, "journal not open"
        self._raise_sync_error()
        try:
            view = memoryview(data)
            while view:
                n = self._f.write(view)
                view = view[n or 0 :]
        except OSError as e:
            raise BatchrunError(f"cannot write the journal {self.path}: {e.strerror or e}") from e
        self.offset += len(data)
        if self.watcher is not None:
            self.watcher.written(self.offset, data)
        cond = self._cond
        with cond:
            self._unsynced += count
            wake = False
            if self._dirty_since is None:
                self._dirty_since = time.monotonic()
                wake = True
            if self._unsynced >= self.group and not self._urgent:
                self._urgent = wake = True
            if self._syncer is None:
                self._syncer = threading.Thread(
                    target=self._sync_loop, name="batchrun-journal-fsync", daemon=True
                )
                self._syncer.start()
            elif wake:
                cond.notify()

    def _sync_loop(self) -> None:
        """The background fsync: what was written, `interval_s` after the first of it (or at once
        when `group` records wait), until the writer closes."""
        cond = self._cond
        with cond:
            while not self._closing:
                since = self._dirty_since
                if since is None:
                    cond.wait()
                    continue
                wait = since + self.interval_s - time.monotonic()
                if wait > 0 and not self._urgent:
                    cond.wait(wait)
                    continue
                f = self._f
                self._unsynced, self._dirty_since, self._urgent = 0, None, False
                if f is None:
                    continue
                error: OSError | None = None
                self._syncing = True
                cond.release()
                try:
                    if self._vectors is not None:  # first: no synced record lacks its vectors
                        self._vectors.fsync()
                    os.fsync(f.fileno())
                except (OSError, ValueError) as e:  # ValueError: closed under us
                    error = e if isinstance(e, OSError) else OSError(str(e))
                finally:
                    cond.acquire()
                    self._syncing = False
                if error is not None:
                    self._error = self._error or error
                    return

    def _raise_sync_error(self) -> None:
        error, self._error = self._error, None
        if error is not None:
            raise BatchrunError(
                f"cannot sync the journal {self.path}: {error.strerror or error}"
            ) from error

    def sync(self) -> None:
        """Flush everything written so far to stable storage, here and now."""
        self._raise_sync_error()
        if self._f is None:
            return
        with self._cond:
            # Nothing new, and no background fsync under way: its records, counted out of
            # _unsynced as it began, are not on the disk until it returns; fsync'ing here too
            # is what makes them so before this returns.
            if self._unsynced == 0 and not self._syncing:
                return
            self._unsynced, self._dirty_since, self._urgent = 0, None, False
        try:
            if self._vectors is not None:
                self._vectors.fsync()
            os.fsync(self._f.fileno())
        except OSError as e:
            raise BatchrunError(f"cannot sync the journal {self.path}: {e.strerror or e}") from e

    def close(self) -> None:
        """Sync and close."""
        if self._f is None:
            return
        try:
            syncer = self._syncer
            if syncer is not None:
                with self._cond:
                    self._closing = True
                    self._cond.notify()
                syncer.join()  # an fsync in flight finishes first
                self._syncer = None
            self.sync()
            if self.watcher is not None:
                self.watcher.closed(self.offset)
        finally:
            self._f.close()
            self._f = None
            if self._vectors is not None:
                self._vectors.close()
                self._vectors = None

    def __enter__(self) -> JournalWriter:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()
