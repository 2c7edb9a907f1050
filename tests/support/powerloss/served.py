"""`batchrun serve` under power cuts: a client that records what the server acknowledged, and
the check that all of it is still there when the server is started again on what the disk kept.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from openai import OpenAI
from openai.types import Batch

from support.ports import free_port
from support.powerloss.crashes import Violation
from support.serving import API_KEY, DONE, lines_of, start_server, stop_server

BATCHES = 2  # the first runs to its end; the second is cancelled at once


@dataclass
class Acks:
    """What the server answered: uploads (id -> bytes), batches made, completed, cancelled."""

    files: dict[str, bytes] = field(default_factory=dict)
    batches: list[str] = field(default_factory=list)
    completed: dict[str, str] = field(default_factory=dict)  # batch id -> output file id
    cancelled: list[str] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)
    stop: threading.Event = field(default_factory=threading.Event)


class ServeRun:
    """One server run on the mount and the client driving it (a thread of its own)."""

    def __init__(self, requests: Path, n: int) -> None:
        self.requests, self.n = requests, n
        self.acks = Acks()
        self.thread: threading.Thread | None = None

    def argv(self, mnt: Path) -> list[str]:
        """The server's command line; the client starts at once (it waits for /health)."""
        if self.thread is not None:
            self.acks.stop.set()
            self.thread.join()
        self.acks = Acks()
        port = free_port()
        self.thread = threading.Thread(
            target=self._drive, args=(f"http://127.0.0.1:{port}", self.acks), daemon=True
        )
        self.thread.start()
        return [
            *(sys.executable, "-m", "batchrun", "serve", "--root", str(mnt / "root")),
            *("--port", str(port), "--engine", "echo", "--batch-size", "8"),
        ]

    def until(self) -> bool:
        """The client has done everything (the power is cut then)."""
        return self.acks.done.is_set()

    def _drive(self, url: str, acks: Acks) -> None:
        """Upload, create, wait for completion, upload, create, cancel; every answer recorded.
        Any error (the power cut: the server stops answering) ends the drive."""
        with contextlib.suppress(Exception):
            _wait_healthy(url, acks)
            client = OpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0, timeout=10)
            data = self.requests.read_bytes()
            for i in range(BATCHES):
                uploaded = client.files.create(file=("in.jsonl", data), purpose="batch")
                acks.files[uploaded.id] = data
                batch = client.batches.create(
                    input_file_id=uploaded.id,
                    endpoint="/v1/chat/completions",
                    completion_window="24h",
                )
                acks.batches.append(batch.id)
                if i == BATCHES - 1:
                    if client.batches.cancel(batch.id).status in ("cancelling", "cancelled"):
                        acks.cancelled.append(batch.id)
                    break
                deadline = time.monotonic() + 30
                while not acks.stop.is_set() and time.monotonic() < deadline:
                    seen = client.batches.retrieve(batch.id)
                    if seen.status == "completed" and seen.output_file_id:
                        acks.completed[batch.id] = seen.output_file_id
                        break
                    acks.stop.wait(0.05)
        acks.done.set()


def _wait_healthy(url: str, acks: Acks) -> None:
    while not acks.stop.is_set():
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        acks.stop.wait(0.05)
    raise RuntimeError("stopped")


def check_served(root: Path, acks: Acks, n: int, where: str) -> None:
    """Start the server again on what the disk kept: every upload answered is there whole, every
    batch made is there and ends, a batch seen completed still has its output, each request in
    an output once, a batch whose cancel was answered ends cancelled."""
    server = start_server(root)
    try:
        client = server.client()
        for file_id, data in acks.files.items():
            try:
                content = client.files.content(file_id).read()
            except Exception as e:
                raise Violation(f"{where}: upload {file_id} was answered, now: {e}") from None
            if content != data:
                raise Violation(
                    f"{where}: upload {file_id} holds {len(content)} bytes of {len(data)}"
                )
        for batch_id in acks.batches:
            try:
                batch = _wait_ended(client, batch_id)
            except Exception as e:
                raise Violation(f"{where}: batch {batch_id} was made, now: {e}") from None
            if batch_id in acks.completed and batch.output_file_id != acks.completed[batch_id]:
                raise Violation(f"{where}: completed batch {batch_id} lost its output file")
            if batch_id in acks.cancelled and batch.status != "cancelled":
                raise Violation(f"{where}: batch {batch_id} cancelled, now {batch.status}")
            if batch.status == "completed":
                ids = [line["custom_id"] for line in lines_of(client, batch.output_file_id)]
                if sorted(ids) != sorted(set(ids)) or len(ids) != n:
                    raise Violation(
                        f"{where}: batch {batch_id}'s output has {len(ids)} lines of {n}"
                    )
    finally:
        stop_server(server)


def _wait_ended(client: OpenAI, batch_id: str, timeout: float = 60) -> Batch:
    """The batch once it has ended (it must, within `timeout`)."""
    deadline = time.monotonic() + timeout
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in DONE:
            return batch
        if time.monotonic() > deadline:
            raise RuntimeError(f"still {batch.status} after {timeout} s")
        time.sleep(0.1)
