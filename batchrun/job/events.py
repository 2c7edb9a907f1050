"""The job's event log (events.jsonl): worker starts with their batch size, restarts and their
reason, out-of-memory back-offs, one JSON line each, for `report`'s charts over time.

Rare events (a start, a death), appended as they happen; a line lost to a crash costs a point
on a chart, nothing else, so there is no fsync.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

EVENTS_NAME = "events.jsonl"


class EventLog:
    """Appends a job's events to its events.jsonl."""

    def __init__(self, job_dir: Path) -> None:
        self.path = Path(job_dir) / EVENTS_NAME

    def write(self, kind: str, **fields: Any) -> None:
        """One event of `kind` now; a disk that refuses it does not stop the job."""
        line = json.dumps({"time": round(time.time(), 3), "kind": kind, **fields})
        with contextlib.suppress(OSError), self.path.open("a", encoding="utf-8") as f:
            f.write(line + "\n")


def read_events(job_dir: Path) -> Iterator[dict[str, Any]]:
    """The job's events in order (none for a job that has no log); a torn line is skipped."""
    path = Path(job_dir) / EVENTS_NAME
    try:
        f = path.open(encoding="utf-8", errors="replace")
    except OSError:
        return
    with f:
        for line in f:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and "kind" in event and "time" in event:
                yield event
