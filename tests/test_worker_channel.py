"""A worker's channel to the parent is closed by neither of its users under the other
(workers/process.py _Channel): a stopped worker's late reader cannot take the next worker's
messages, and no channel is left open once both are done."""

from __future__ import annotations

import io
import os
import queue
import threading
import time
from multiprocessing import connection
from typing import Any

import pytest
from support.waits import wait_until

from batchrun.config import EngineSettings
from batchrun.openai.records import Request
from batchrun.workers.messages import Delivery, Eof, Inbox, Ready, Results
from batchrun.workers.process import Worker

CHAT = "/v1/chat/completions"


class _HeldReader:
    """Connection._recv as the standard library writes it, except that a read of the held
    connection stops between taking its descriptor's number and reading it, until released:
    the place where a thread switch under load lets another thread close the connection."""

    def __init__(self) -> None:
        self.held: Any = None
        self.waiting = threading.Event()
        self.release = threading.Event()

    def __call__(self, conn: Any, size: int, read: Any = os.read) -> io.BytesIO:
        buf = io.BytesIO()
        handle = conn._handle
        if conn is self.held and not self.release.is_set():
            self.waiting.set()
            self.release.wait(30)
        remaining = size
        while remaining > 0:
            chunk = read(handle, remaining)
            if not chunk:
                if remaining == size:
                    raise EOFError
                raise OSError("got end of file during message")
            buf.write(chunk)
            remaining -= len(chunk)
        return buf


def _fill_lower_numbers(number: int, taken: list[int]) -> None:
    """Take every free descriptor number below `number` (into `taken`), so that were `number`
    freed, the next pipe would get it (the kernel gives the lowest free one): the case under
    test, made sure."""
    while (fd := os.open(os.devnull, os.O_RDONLY)) < number:
        taken.append(fd)
    os.close(fd)


def _next(inbox: Inbox, generation: int, timeout: float = 30.0) -> Delivery:
    """The next message of the worker's process `generation` (older ones' are skipped)."""
    end = time.monotonic() + timeout
    while True:
        item = inbox.get(timeout=max(0.01, end - time.monotonic()))
        if item[1] == generation:
            return item


def test_a_stopped_workers_late_reader_cannot_take_the_next_workers_messages(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reader = _HeldReader()
    monkeypatch.setattr(
        connection.Connection, "_recv", lambda conn, size, read=os.read: reader(conn, size, read)
    )
    worker = Worker(0, EngineSettings(engine="echo"), {})
    inbox: Inbox = queue.Queue()
    taken: list[int] = []
    worker.start(inbox)
    try:
        assert isinstance(_next(inbox, 1)[2], Ready)
        old = worker.conn
        reader.held = old
        # Its answer's length arrives; the reader stops before reading the rest.
        worker.send([Request("r0", 1, CHAT, {"messages": [{"role": "user", "content": "hi"}]})])
        assert reader.waiting.wait(30)
        _fill_lower_numbers(old.fileno() if old is not None else 0, taken)
        worker.stop(timeout=10)
        worker.start(inbox)  # a new pipe: the old one's descriptor numbers, had they been freed
        reader.release.set()
        first = _next(inbox, 2)[2]
        assert isinstance(first, Ready), first  # not an end-of-file of a stream cut short
        worker.send([Request("r1", 2, CHAT, {"messages": [{"role": "user", "content": "yo"}]})])
        message = _next(inbox, 2)[2]
        while not isinstance(message, Results | Eof):
            message = _next(inbox, 2)[2]
        assert isinstance(message, Results), message
        assert [o.custom_id for o in message.outcomes] == ["r1"]
        # The old reader finished its message, then saw its worker's end and closed the channel.
        assert old is not None
        wait_until(lambda: old.closed, "the old reader closed the channel", timeout=10, every=0.01)
    finally:
        reader.release.set()
        worker.kill()
        for fd in taken:
            os.close(fd)
