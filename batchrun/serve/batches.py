"""The batch records: ROOT/batches/<id>/batch.json beside the batch's job (the same directory).

A record holds the OpenAI Batch object the API returns, plus what the server needs to go on
after a restart (the priority, the order of creation, and the terminal status a finalizing batch
is headed for).

Every change of a batch's status is a transition decided under the store's lock against the
record as it is on disk (the copy in memory is only ever changed together with its atomic write,
under that lock): a transition names the statuses it may start from, and does nothing from any
other. So two threads racing (the validator, the runner, the finisher, a cancel) can never write
a status from a stale read, and a terminal status is never left. The request counts of a running
batch are written with the record at most every COUNTS_SAVE_S seconds, so that they never go
back across a restart (the journal stays their truth: a restart counts them again from it).

An index kept with the records (their creation order, the counts by status, the summed request
counts) makes a page of the list and /metrics cost what they show, not the number of batches.
"""

from __future__ import annotations

import bisect
import copy
import json
import threading
import time
from collections.abc import Collection
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal

from batchrun.job.files import make_dirs, write_json_atomic
from batchrun.serve.ids import is_batch_id
from batchrun.serve.tenants import EVERYONE, visible

RECORD_NAME = "batch.json"
TERMINAL = frozenset({"completed", "failed", "expired", "cancelled"})
# The statuses a cancel stops (a finalizing batch has finished: its cancel answers it unchanged).
CANCELLABLE = frozenset({"validating", "in_progress"})
PRIORITIES = {"high": 0, "normal": 1, "low": 2}
# How often a running batch's request counts are written with its record (at most).
COUNTS_SAVE_S = 1.0
# A batch's place in the queue: priority (high first), creation second, creation sequence, id.
QueueOrder = tuple[int, int, int, str]
# A batch's place in creation order: its second, its sequence within the root, its id.
Created = tuple[int, int, str]
COUNT_KEYS = ("total", "completed", "failed")


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
    # The tenant that made it (serve/tenants.py); None: made before the server had keys.
    owner: str | None = None

    @property
    def id(self) -> str:
        """The batch id."""
        return str(self.batch["id"])

    @property
    def status(self) -> str:
        """The batch's status as the API shows it."""
        return str(self.batch["status"])

    def created(self) -> Created:
        """The key of creation order: the second, then the sequence within the root, then id."""
        return (int(self.batch["created_at"]), self.seq, self.id)

    def queue_order(self) -> QueueOrder:
        """Where the batch runs in the queue: by priority, then in creation order."""
        return (PRIORITIES.get(self.priority, 1), *self.created())

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready copy: its fields by name (the batch object itself not copied)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


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
        make_dirs(self.dir)
        self._lock = threading.Lock()
        self._records: dict[str, BatchRecord] = {}
        self._order: list[Created] = []  # ascending creation order
        self._by_status: dict[str, int] = {}
        self._totals = dict.fromkeys(COUNT_KEYS, 0)
        # By tenant: its batches by status and its request counts summed (/metrics).
        self._tenant_status: dict[tuple[str, str], int] = {}
        self._tenant_totals: dict[tuple[str, str], int] = {}
        self._counts_saved: dict[str, float] = {}
        for path in self.dir.glob(f"*/{RECORD_NAME}"):
            if is_batch_id(path.parent.name) and (record := _load(path)) is not None:
                self._index(record)
        # Batches made after a restart come after every batch made before it.
        self._next_seq = max((r.seq for r in self._records.values()), default=0) + 1

    def job_dir(self, batch_id: str) -> Path:
        """The batch's job directory (the id must have passed `is_batch_id`)."""
        return self.dir / batch_id

    def add(self, record: BatchRecord) -> None:
        """Store a new batch, numbered in the order of creation (its directory is made here)."""
        # Its name durable before the batch is answered: a power cut must not take it back.
        make_dirs(self.job_dir(record.id))
        with self._lock:
            record.seq, self._next_seq = self._next_seq, self._next_seq + 1
            self._save(record)
            self._index(record)

    def get(self, batch_id: str, tenant: str | None = EVERYONE) -> BatchRecord | None:
        """A copy of a batch's record, or None when there is no such batch or `tenant` does not
        see it (serve/tenants.py)."""
        if not is_batch_id(batch_id):
            return None
        with self._lock:
            record = self._records.get(batch_id)
            if record is None or not visible(record.owner, tenant):
                return None
            return copy.deepcopy(record)

    def all(self) -> list[BatchRecord]:
        """Copies of every record, newest first (for a start: pages use `page`)."""
        with self._lock:
            return [copy.deepcopy(self._records[key[2]]) for key in reversed(self._order)]

    def page(
        self,
        limit: int,
        after: str | None = None,
        order: Literal["asc", "desc"] = "desc",
        tenant: str | None = EVERYONE,
    ) -> tuple[list[dict[str, Any]], bool]:
        """The Batch objects `tenant` sees of one page (newest first unless `order` is asc),
        from the one after the batch `after` (none when it is unknown, or not the tenant's),
        and whether more follow; only the page is copied."""
        with self._lock:
            if after is None:
                start = 0
            else:
                known = self._records.get(after)
                if known is None or not visible(known.owner, tenant):
                    return [], False
                at = bisect.bisect_left(self._order, known.created())
                start = (len(self._order) - at) if order == "desc" else at + 1
            if tenant is EVERYONE:
                keys = _slice(self._order, start, limit + 1, order)
            else:
                keys = self._visible_keys(start, limit + 1, order, tenant)
            shown = [copy.deepcopy(self._records[key[2]].batch) for key in keys[:limit]]
            return shown, len(keys) > limit

    def _visible_keys(
        self, start: int, n: int, direction: str, tenant: str | None
    ) -> list[Created]:
        """`n` keys `tenant` sees, from position `start` of the creation order read in
        `direction` (under the lock)."""
        found: list[Created] = []
        at = start
        while len(found) < n and at < len(self._order):
            key = self._order[at] if direction == "asc" else self._order[len(self._order) - 1 - at]
            if visible(self._records[key[2]].owner, tenant):
                found.append(key)
            at += 1
        return found

    def tenant_counts(self) -> tuple[dict[tuple[str, str], int], dict[tuple[str, str], int]]:
        """By (tenant, status), the number of batches; by (tenant, count), the sum of their
        request_counts (batches made before the server had keys are in neither)."""
        with self._lock:
            by_status = {k: v for k, v in self._tenant_status.items() if v}
            return by_status, dict(self._tenant_totals)

    def counts(self) -> tuple[dict[str, int], dict[str, int]]:
        """The number of batches by status, and the sum of every batch's request_counts."""
        with self._lock:
            by_status = {k: v for k, v in self._by_status.items() if v}
            return by_status, dict(self._totals)

    def transition(
        self,
        batch_id: str,
        sources: Collection[str],
        *,
        final: str | None = None,
        **fields: Any,
    ) -> BatchRecord | None:
        """Change a batch whose status (as on disk) is one of `sources`, and write it; return a
        copy, or None when its status is another (nothing is changed then)."""
        with self._lock:
            record = self._records.get(batch_id)
            if record is None or record.status not in sources:
                return None
            self._change(record, fields, final)
            return copy.deepcopy(record)

    def update(self, batch_id: str, **fields: Any) -> BatchRecord:
        """Change fields of a batch's object other than its status (an output's file id), and
        write it; return a copy."""
        assert "status" not in fields, "a status changes by `transition` or `end`"
        with self._lock:
            record = self._records[batch_id]
            self._change(record, fields, None)
            return copy.deepcopy(record)

    def end(self, batch_id: str, status: str, **fields: Any) -> BatchRecord | None:
        """End a batch that has not ended: `status`, or cancelled when a cancel came first
        (it is cancelling); its `<status>_at` stamped. None when it had already ended."""
        assert status in TERMINAL
        with self._lock:
            record = self._records.get(batch_id)
            if record is None or record.status in TERMINAL:
                return None
            if record.status == "cancelling":
                status = "cancelled"
            fields = {"status": status, f"{status}_at": int(time.time()), **fields}
            self._change(record, fields, None)
            return copy.deepcopy(record)

    def set_counts(self, batch_id: str, total: int, completed: int, failed: int) -> None:
        """Move a running batch's request counts; written with its record at most every
        COUNTS_SAVE_S seconds (the journal is their truth)."""
        counts = {"total": total, "completed": completed, "failed": failed}
        with self._lock:
            record = self._records.get(batch_id)
            if record is None or record.status in TERMINAL:
                return
            self._recount(record, counts)
            now = time.monotonic()
            if now - self._counts_saved.get(batch_id, 0.0) >= COUNTS_SAVE_S:
                self._counts_saved[batch_id] = now
                self._save(record)

    def _change(self, record: BatchRecord, fields: dict[str, Any], final: str | None) -> None:
        """Apply `fields` to a record and write it (under the lock), keeping the index."""
        old_status = record.status
        counts = fields.pop("request_counts", None)
        record.batch.update(fields)
        if final is not None:
            record.final = final
        if counts is not None:
            self._recount(record, counts)
        if record.status != old_status:
            self._by_status[old_status] -= 1
            self._by_status[record.status] = self._by_status.get(record.status, 0) + 1
            if record.owner is not None:
                self._tenant_status[(record.owner, old_status)] -= 1
                key = (record.owner, record.status)
                self._tenant_status[key] = self._tenant_status.get(key, 0) + 1
        self._save(record)

    def _recount(self, record: BatchRecord, counts: dict[str, int]) -> None:
        old = _counts(record)
        record.batch["request_counts"] = {k: int(counts.get(k, 0)) for k in COUNT_KEYS}
        for k in COUNT_KEYS:
            self._totals[k] += record.batch["request_counts"][k] - old[k]
            if record.owner is not None:
                key = (record.owner, k)
                self._tenant_totals[key] = (
                    self._tenant_totals.get(key, 0) + record.batch["request_counts"][k] - old[k]
                )

    def _index(self, record: BatchRecord) -> None:
        self._records[record.id] = record
        bisect.insort(self._order, record.created())
        self._by_status[record.status] = self._by_status.get(record.status, 0) + 1
        for k, v in _counts(record).items():
            self._totals[k] += v
        if record.owner is not None:
            key = (record.owner, record.status)
            self._tenant_status[key] = self._tenant_status.get(key, 0) + 1
            for k, v in _counts(record).items():
                self._tenant_totals[(record.owner, k)] = (
                    self._tenant_totals.get((record.owner, k), 0) + v
                )

    def _save(self, record: BatchRecord) -> None:
        write_json_atomic(self.job_dir(record.id) / RECORD_NAME, record.to_dict())


def _slice(order: list[Created], start: int, n: int, direction: str) -> list[Created]:
    """`n` keys from position `start` of `order` read in `direction` (desc: from its end)."""
    if direction == "asc":
        return order[start : start + n]
    end = len(order) - start
    return order[max(0, end - n) : max(0, end)][::-1]


def _counts(record: BatchRecord) -> dict[str, int]:
    """A record's request counts (0 for any that is missing or not a number)."""
    counts = record.batch.get("request_counts")
    counts = counts if isinstance(counts, dict) else {}
    return {
        k: v if isinstance(v := counts.get(k), int) and not isinstance(v, bool) else 0
        for k in COUNT_KEYS
    }


def _load(path: Path) -> BatchRecord | None:
    """A record read from disk, or None when it cannot be read (a record written before `seq`
    was kept loads with 0: it is ordered by its creation second, then its id)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        seq = data.get("seq", 0)
        owner = data.get("owner")
        record = BatchRecord(
            data["batch"],
            data.get("priority", "normal"),
            data.get("final"),
            seq if isinstance(seq, int) and not isinstance(seq, bool) else 0,
            owner if isinstance(owner, str) else None,
        )
        record.created()  # a record without its creation time cannot be listed
        return record
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return None
