"""The append-only journal: the job's checkpoint, one JSON line per finished attempt.

Each record is written to the file as soon as it arrives (so a killed process loses nothing the
kernel already has) and fsync'd in groups (so a power cut loses at most one group). On open, a
torn last line left by a crash mid-write is cut off.

Record shapes (one JSON object a line):

- ``{"kind": "result", "custom_id", "line", "attempt", "ok", "status_code", "body", "error",
  "retryable", "prompt_tokens", "completion_tokens", "latency_s", "time"}``: one attempt.
- ``{"kind": "invalid", "custom_id", "line", "error", "time"}``: an input line that failed
  validation (``custom_id`` is null when none could be read). A forced resume's reading of a
  changed input adds ``"generation"``, its input map's (see job.InputMap).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from batchrun.errors import BatchrunError
from batchrun.openai.records import LineError, Outcome

JOURNAL_NAME = "journal.jsonl"

# Built once: json.dumps with options builds a new encoder on every call.
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))
# For the rare record that UTF-8 cannot hold (a lone surrogate in a model's text, an error
# message or an old journal's custom_id): every non-ASCII character becomes a \uXXXX escape,
# which is still valid JSON and reads back as the same string.
_ASCII_ENCODER = json.JSONEncoder(ensure_ascii=True, separators=(",", ":"))


def encode_record(record: dict[str, Any]) -> bytes:
    """One journal line: the record as compact JSON in UTF-8, with its newline."""
    try:
        return _ENCODER.encode(record).encode("utf-8") + b"\n"
    except UnicodeEncodeError:
        # Nothing a record holds may stop the journal: a result is lost otherwise, and with it
        # possibly the job.
        return _ASCII_ENCODER.encode(record).encode("ascii") + b"\n"


def result_record(outcome: Outcome, line: int, attempt: int) -> dict[str, Any]:
    """The journal record of one attempt."""
    return {
        "kind": "result",
        "custom_id": outcome.custom_id,
        "line": line,
        "attempt": attempt,
        "ok": outcome.ok,
        "status_code": outcome.status_code,
        "body": outcome.body,
        "error": outcome.error,
        "retryable": outcome.retryable,
        "prompt_tokens": outcome.prompt_tokens,
        "completion_tokens": outcome.completion_tokens,
        "latency_s": round(outcome.latency_s, 6),
        "time": round(time.time(), 3),
    }


def invalid_record(err: LineError) -> dict[str, Any]:
    """The journal record of an input line that failed validation."""
    return {
        "kind": "invalid",
        "custom_id": err.custom_id,
        "line": err.line,
        "error": {"code": err.code, "message": err.message},
        "time": round(time.time(), 3),
    }


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


def read_records(path: Path, *, strict: bool = True) -> Iterator[dict[str, Any]]:
    """Yield the journal's records in order.

    A line that is not a JSON object is a corrupt journal: with `strict`, that raises a
    BatchrunError naming the line; otherwise the line is skipped. A torn final line (no newline)
    is ignored here; `repair_tail` removes it for good when a writer opens the journal.
    """
    if not path.exists():
        return
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, start=1):
            if not raw.endswith(b"\n"):
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


@dataclass
class JournalWriter:
    """Appends records to the journal: written at once, fsync'd every `group` records or `interval`."""

    path: Path
    group: int = 256
    interval_s: float = 1.0
    _f: BinaryIO | None = field(default=None, init=False)
    _unsynced: int = field(default=0, init=False)
    _last_sync: float = field(default=0.0, init=False)

    def open(self) -> JournalWriter:
        """Repair a torn tail and open for appending."""
        try:
            repair_tail(self.path)
            # buffering=0: every write() reaches the kernel, so a killed process loses nothing.
            self._f = open(self.path, "ab", buffering=0)  # noqa: SIM115
        except OSError as e:  # a read-only or full job directory: one line, not a traceback
            raise BatchrunError(f"cannot open the journal {self.path}: {e.strerror or e}") from e
        self._last_sync = time.monotonic()
        return self

    def append(self, records: Iterable[dict[str, Any]]) -> None:
        """Write records in one system call; fsync when the group is full or old enough."""
        assert self._f is not None, "journal not open"
        data = b"".join(map(encode_record, records))
        if not data:
            return
        try:
            view = memoryview(data)
            while view:
                n = self._f.write(view)
                view = view[n or 0 :]
        except OSError as e:
            raise BatchrunError(f"cannot write the journal {self.path}: {e.strerror or e}") from e
        self._unsynced += data.count(b"\n")
        now = time.monotonic()
        if self._unsynced >= self.group or now - self._last_sync >= self.interval_s:
            self.sync()

    def sync(self) -> None:
        """Flush what was written to stable storage."""
        if self._f is None or self._unsynced == 0:
            return
        try:
            os.fsync(self._f.fileno())
        except OSError as e:
            raise BatchrunError(f"cannot sync the journal {self.path}: {e.strerror or e}") from e
        self._unsynced = 0
        self._last_sync = time.monotonic()

    def close(self) -> None:
        """Sync and close."""
        if self._f is None:
            return
        try:
            self.sync()
        finally:
            self._f.close()
            self._f = None

    def __enter__(self) -> JournalWriter:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()
