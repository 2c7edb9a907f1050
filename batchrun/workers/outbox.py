"""A worker's messages to its parent, in order; results only once their bodies are on the disk.

A worker of a job's run writes its results' bodies to its shard (job/shards.py) and sends the
parent only where they are, after an fsync: a journal record must never name shard bytes a
power cut could take. The fsync runs in a thread of its own, so the engine steps on meanwhile,
and covers everything that queued while the one before it ran (group commit: one fsync a round
however many results finished). Every other message goes through the same queue, so the parent
hears them in the order the worker said them (a step's prefix-cache counters and batch size
before its results, a restart request after them).

Without a shard (serve's workers) messages are sent at once, in the caller's thread, with their
bodies, as before shards.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import deque
from multiprocessing.connection import Connection

from batchrun.errors import BatchrunError
from batchrun.job.shards import ShardWriter
from batchrun.workers.messages import Fatal, FromWorker, Results


class Outbox:
    """Sends a worker's messages to its parent; with a shard, from a thread that stores and
    syncs the results' bodies first."""

    def __init__(self, conn: Connection, shard: ShardWriter | None) -> None:
        self.conn = conn
        self.shard = shard
        self._queue: deque[FromWorker] = deque()
        self._cond = threading.Condition()
        self._closing = False
        self._thread: threading.Thread | None = None
        # Set when the shard could not be written (the parent was told, with a Fatal) or the
        # parent went away: the worker has nothing left to do.
        self.failed = False

    def send(self, message: FromWorker) -> None:
        """Send `message` after everything sent before it."""
        if self.shard is None:
            self.conn.send(message)
            return
        with self._cond:
            self._queue.append(message)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="batchrun-worker-outbox", daemon=True
                )
                self._thread.start()
            else:
                self._cond.notify()

    def close(self) -> None:
        """Send what is queued, then stop the thread."""
        thread = self._thread
        if thread is None:
            return
        with self._cond:
            self._closing = True
            self._cond.notify()
        thread.join()
        self._thread = None
        if self.shard is not None:
            self.shard.close()

    def _run(self) -> None:
        shard = self.shard
        assert shard is not None
        cond = self._cond
        while True:
            with cond:
                while not self._queue and not self._closing:
                    cond.wait()
                if not self._queue:
                    return
                items = list(self._queue)
                self._queue.clear()
            try:
                stored = 0
                for message in items:
                    if isinstance(message, Results):
                        stored += shard.store(message.outcomes)
                if stored:
                    shard.sync()
            except BatchrunError as e:
                self.failed = True
                # No restart can help a full or read-only job directory: the job stops, saying why.
                with contextlib.suppress(OSError):
                    self.conn.send(Fatal(oom=False, message=str(e), stops_job=True))
                    self.conn.close()
                # The engine's loop may be waiting for requests that will never come: end the
                # worker from here (the parent kills what is left of its group).
                os._exit(4)
            try:
                for message in items:
                    self.conn.send(message)
            except (OSError, EOFError):  # the parent went away: nothing left to report to
                self.failed = True
                return
