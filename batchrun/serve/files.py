"""The file store: uploads and batch outputs under ROOT/files, each listed only once whole.

A file is `<id>.jsonl` (its bytes) and `<id>.json` (what the API shows); the record, written
atomically after the bytes are in place, is what makes a file exist. A killed upload leaves at
most a temporary file or bytes with no record, both removed at the next start.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

from batchrun.job.files import fsync_dir, make_dirs, write_json_atomic
from batchrun.serve.ids import is_file_id, new_file_id
from batchrun.serve.tenants import EVERYONE, visible

TMP_PREFIX = ".upload-"
# The key of a file's creation sequence in its record on disk (not shown: files made in one
# second are listed in the order they were made, across restarts).
SEQ_KEY = "_seq"
# The key of the tenant that owns a file in its record on disk (not shown; serve/tenants.py).
OWNER_KEY = "_owner"


class FileStore:
    """The files of one server root: add, list, read and delete, safe across threads."""

    def __init__(self, root: Path) -> None:
        self.dir = root / "files"
        make_dirs(self.dir)  # its name durable: uploads answered 200 live in it
        self._lock = threading.Lock()
        self._records: dict[str, dict[str, Any]] = {}
        self._seq: dict[str, int] = {}
        self._owner: dict[str, str] = {}  # files of no tenant (made before keys) are not in it
        # The earliest `expires_at` of any file (None: none expires), so that asking for files
        # looks through them all only when one is due.
        self._next_expiry: float | None = None
        self._load()
        self._next_seq = max(self._seq.values(), default=0) + 1

    def _load(self) -> None:
        """Read every record; drop what a killed upload or delete left behind."""
        for tmp in self.dir.glob(f"{TMP_PREFIX}*"):
            tmp.unlink(missing_ok=True)
        for tmp in self.dir.glob(".*.tmp"):  # an atomic record write cut short
            tmp.unlink(missing_ok=True)
        for meta in self.dir.glob("*.json"):
            try:
                record = json.loads(meta.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if (
                isinstance(record, dict)
                and is_file_id(meta.stem)
                and self.content(meta.stem).exists()
            ):
                seq = record.pop(SEQ_KEY, 0)
                self._seq[meta.stem] = seq if isinstance(seq, int) else 0
                owner = record.pop(OWNER_KEY, None)
                if isinstance(owner, str):
                    self._owner[meta.stem] = owner
                self._records[meta.stem] = record
                self._expires(record)
        for data in self.dir.glob("*.jsonl"):
            if data.stem not in self._records:
                data.unlink(missing_ok=True)

    def content(self, file_id: str) -> Path:
        """Where a file's bytes are (the id must have passed `is_file_id`)."""
        return self.dir / f"{file_id}.jsonl"

    def temp_path(self) -> Path:
        """A fresh temporary path for an upload in progress (removed at the next start)."""
        return self.dir / f"{TMP_PREFIX}{os.getpid()}-{new_file_id()}.tmp"

    def add(
        self,
        tmp: Path,
        filename: str,
        purpose: str,
        expires_after: int | None = None,
        owner: str | None = None,
    ) -> dict[str, Any]:
        """Make the finished, fsync'd temporary file `tmp` a file of `owner` (deleted
        `expires_after` seconds after its creation, when given); return its record."""
        return self._publish(tmp, new_file_id(), filename, purpose, expires_after, owner)

    def add_copy(
        self,
        source: Path,
        filename: str,
        purpose: str,
        expires_after: int | None = None,
        file_id: str | None = None,
        owner: str | None = None,
    ) -> dict[str, Any]:
        """Make a file of `source` (a batch's output, `owner`'s as its batch is): a hard link,
        else a copy; with `expires_after`, deleted that many seconds after its creation. With
        `file_id`, a file of that id made before is kept and returned (made again it would be
        the same)."""
        if file_id is None:
            file_id = new_file_id()
        elif (known := self.get(file_id)) is not None:
            return known
        tmp = self.temp_path()
        try:
            os.link(source, tmp)
        except OSError:
            shutil.copyfile(source, tmp)
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
        return self._publish(tmp, file_id, filename, purpose, expires_after, owner)

    def _publish(
        self,
        tmp: Path,
        file_id: str,
        filename: str,
        purpose: str,
        expires_after: int | None,
        owner: str | None,
    ) -> dict[str, Any]:
        """Move the fsync'd temporary file `tmp` into place as file `file_id` (its directory
        fsync'd: the file survives a crash), then record and return it."""
        os.replace(tmp, self.content(file_id))
        fsync_dir(self.dir)
        now = int(time.time())
        record: dict[str, Any] = {
            "id": file_id,
            "object": "file",
            "bytes": self.content(file_id).stat().st_size,
            "created_at": now,
            "filename": filename,
            "purpose": purpose,
            "status": "processed",
            "expires_at": None if expires_after is None else now + expires_after,
            "status_details": None,
        }
        with self._lock:
            seq, self._next_seq = self._next_seq, self._next_seq + 1
            hidden: dict[str, Any] = {SEQ_KEY: seq}
            if owner is not None:
                hidden[OWNER_KEY] = owner
                self._owner[file_id] = owner
            write_json_atomic(self.dir / f"{file_id}.json", {**record, **hidden})
            self._seq[file_id] = seq
            self._records[file_id] = record
            self._expires(record)
        return dict(record)

    def _expires(self, record: dict[str, Any]) -> None:
        at = record.get("expires_at")
        if at is not None and (self._next_expiry is None or at < self._next_expiry):
            self._next_expiry = at

    def get(self, file_id: str, tenant: str | None = EVERYONE) -> dict[str, Any] | None:
        """A file's record, or None when there is no such file (an expired one is deleted) or
        `tenant` does not see it (serve/tenants.py)."""
        if not is_file_id(file_id):
            return None
        self.delete_expired()
        with self._lock:
            record = self._records.get(file_id)
            if record is None or not visible(self._owner.get(file_id), tenant):
                return None
        return dict(record)

    def owner(self, file_id: str) -> str | None:
        """The tenant that owns a file (None: made before the server had keys, or no file)."""
        with self._lock:
            return self._owner.get(file_id)

    def list(
        self, purpose: str | None = None, tenant: str | None = EVERYONE
    ) -> list[dict[str, Any]]:
        """Every file's record that `tenant` sees (of one purpose, when given), newest first."""
        self.delete_expired()
        with self._lock:
            keyed = [
                ((r.get("created_at", 0), self._seq.get(i, 0), i), r)
                for i, r in self._records.items()
                if (not purpose or r.get("purpose") == purpose)
                and visible(self._owner.get(i), tenant)
            ]
        # Newest first, stable: by creation second, then the order made in, then id.
        keyed.sort(key=lambda pair: pair[0], reverse=True)
        return [dict(r) for _, r in keyed]

    def delete_expired(self) -> None:
        """Delete the files whose `expires_at` has passed (checked as files are asked for, so
        an expired file is never shown)."""
        now = time.time()
        with self._lock:
            if self._next_expiry is None or now < self._next_expiry:
                return
            expired = []
            self._next_expiry = None
            for file_id, r in self._records.items():
                at = r.get("expires_at")
                if at is None:
                    continue
                if at <= now:
                    expired.append(file_id)
                elif self._next_expiry is None or at < self._next_expiry:
                    self._next_expiry = at
        for file_id in expired:
            self.delete(file_id)

    def delete(self, file_id: str, tenant: str | None = EVERYONE) -> bool:
        """Remove a file `tenant` sees (its record first, so it is never listed without its
        bytes); False when there is none."""
        if not is_file_id(file_id):
            return False
        with self._lock:
            if file_id not in self._records or not visible(self._owner.get(file_id), tenant):
                return False
            del self._records[file_id]
            self._seq.pop(file_id, None)
            self._owner.pop(file_id, None)
        (self.dir / f"{file_id}.json").unlink(missing_ok=True)
        fsync_dir(self.dir)
        with contextlib.suppress(OSError):
            self.content(file_id).unlink()
        return True
