"""The batch records: ROOT/batches/<id>/batch.json beside the batch's job (the same directory).

A record holds the OpenAI Batch object the API returns, plus what the server needs to go on
after a restart (the priority, the order of creation, and the terminal status a finalizing batch
is headed for). Each change of status is written atomically; the request counts of a running
batch move in memory only (a restart counts them again from the journal).
"""

from __future__ import annotations

import copy
import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batchrun.job.files import write_json_atomic
from batchrun.serve.ids import is_batch_id

RECORD_NAME = "batch.json"
TERMINAL = frozenset({"completed", "failed", "expired", "cancelled"})
PRIORITIES = {"high": 0, "normal": 1, "low": 2}
# A batch's place in the queue: priority (high first), creation second, creation sequence, id.
QueueOrder = tuple[int, int, int, str]


@dataclass
class BatchRecord:
    """One batch: the API's object, its queue priority, its creation sequence, and where
    finalizing leads."""

    batch: dict[str, Any]
    priority: str = "normal"
    final: str | None = None
    # The order of creation within the root (`created_at` is whole seconds, OpenAI's shape, so
    # batches made in the same second need it); 0 in records written before it was kept.
    seq: int = 0

    @property
    def id(self) -> str:
        """The batch id."""
        return str(self.batch["id"])

    @property
    def status(self) -> str:
        """The batch's status as the API shows it."""
        return str(self.batch["status"])

    def created(self) -> tuple[int, int, str]:
        """The key of creation order: the second, then the sequence within the root, then id."""
        return (int(self.batch["created_at"]), self.seq, self.id)

    def queue_order(self) -> QueueOrder:
        """Where the batch runs in the queue: by priority, then in creation order."""
        return (PRIORITIES.get(self.priority, 1), *self.created())

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready copy."""
        return {
            "batch": self.batch,
            "priority": self.priority,
            "final": self.final,
            "seq": self.seq,
        }


def new_batch(
    batch_id: str,
    input_file_id: str,
    endpoint: str,
    window: str,
    window_s: float,
    metadata: dict[str, str] | None,
    model: str,
) -> dict[str, Any]:
    """The Batch object of a batch just created (status validating)."""
    now = int(time.time())
    return {
        "id": batch_id,
        "object": "batch",
        "endpoint": endpoint,
        "model": model,
        "errors": None,
        "input_file_id": input_file_id,
        "completion_window": window,
        "status": "validating",
        "output_file_id": None,
        "error_file_id": None,
        "created_at": now,
        "in_progress_at": None,
        "expires_at": int(now + window_s),
        "finalizing_at": None,
        "completed_at": None,
        "failed_at": None,
        "expired_at": None,
        "cancelling_at": None,
        "cancelled_at": None,
        "request_counts": {"total": 0, "completed": 0, "failed": 0},
        "metadata": metadata,
        "usage": None,
    }


class BatchStore:
    """Every batch of one server root, in memory and on disk, safe across threads."""

    def __init__(self, root: Path) -> None:
        self.dir = root / "batches"
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._records: dict[str, BatchRecord] = {}
        for path in self.dir.glob(f"*/{RECORD_NAME}"):
            if is_batch_id(path.parent.name) and (record := _load(path)) is not None:
                self._records[record.id] = record
        # Batches made after a restart come after every batch made before it.
        self._next_seq = max((r.seq for r in self._records.values()), default=0) + 1

    def job_dir(self, batch_id: str) -> Path:
        """The batch's job directory (the id must have passed `is_batch_id`)."""
        return self.dir / batch_id

    def add(self, record: BatchRecord) -> None:
        """Store a new batch, numbered in the order of creation (its directory is made here)."""
        self.job_dir(record.id).mkdir(parents=True, exist_ok=True)
        with self._lock:
            record.seq, self._next_seq = self._next_seq, self._next_seq + 1
            self._records[record.id] = record
            self._save(record)

    def get(self, batch_id: str) -> BatchRecord | None:
        """A copy of a batch's record, or None when there is no such batch."""
        if not is_batch_id(batch_id):
            return None
        with self._lock:
            record = self._records.get(batch_id)
            return copy.deepcopy(record) if record is not None else None

    def all(self) -> list[BatchRecord]:
        """Copies of every record, newest first."""
        with self._lock:
            records = [copy.deepcopy(r) for r in self._records.values()]
        records.sort(key=BatchRecord.created, reverse=True)
        return records

    def update(self, batch_id: str, *, final: str | None = None, **fields: Any) -> BatchRecord:
        """Change fields of a batch's object (and where it is headed) and write it; return a copy."""
        with self._lock:
            record = self._records[batch_id]
            record.batch.update(fields)
            if final is not None:
                record.final = final
            self._save(record)
            return copy.deepcopy(record)

    def set_counts(self, batch_id: str, total: int, completed: int, failed: int) -> None:
        """Move a running batch's request counts (in memory: the journal is their truth)."""
        with self._lock:
            record = self._records.get(batch_id)
            if record is not None:
                record.batch["request_counts"] = {
                    "total": total,
                    "completed": completed,
                    "failed": failed,
                }

    def _save(self, record: BatchRecord) -> None:
        write_json_atomic(self.job_dir(record.id) / RECORD_NAME, record.to_dict())


def _load(path: Path) -> BatchRecord | None:
    """A record read from disk, or None when it cannot be read (a record written before `seq`
    was kept loads with 0: it is ordered by its creation second, then its id)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        seq = data.get("seq", 0)
        return BatchRecord(
            data["batch"],
            data.get("priority", "normal"),
            data.get("final"),
            seq if isinstance(seq, int) and not isinstance(seq, bool) else 0,
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
