"""A `batchrun serve` for tests: start one on the echo engine, reach it with the `openai` package,
make and wait for batches, stop it (tests/test_serve*.py and the tests that drive a server)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from openai import OpenAI
from openai.types import Batch

from support.lines import chat_line, write_jsonl
from support.paths import ROOT
from support.ports import free_port
from support.waits import wait_until

API_KEY = "test-key-123"
DONE = ("completed", "failed", "expired", "cancelled")
# Slow enough that a batch of a few hundred requests takes seconds (the echo engine's requests
# overlap: 4 at a time of 20 ms each, about 200 requests a second).
SLOW_ENGINE = ("--batch-size", "4")
SLOW_ENV = {"BATCHRUN_ECHO_DELAY_MS": "20"}


@dataclass
class Server:
    """A running `batchrun serve` and how to reach it."""

    process: subprocess.Popen[bytes]
    root: Path
    url: str
    log: Path

    def client(self, api_key: str = API_KEY) -> OpenAI:
        """An openai client for this server (no retries: every answer is seen as it is)."""
        return OpenAI(base_url=f"{self.url}/v1", api_key=api_key, max_retries=0, timeout=30)

    def batch_dir(self, batch_id: str) -> Path:
        """The batch's job directory."""
        return self.root / "batches" / batch_id


def start_server(
    root: Path,
    *args: str,
    env: dict[str, str] | None = None,
    engine: str | None = "echo",
    timeout: float = 30,
) -> Server:
    """Start `batchrun serve` (on the echo engine unless `engine` is None: the default, vLLM) in
    its own process group; wait for /health."""
    port = free_port()
    log = root.parent / f"{root.name}-serve-{port}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "batchrun",
                "serve",
                "--root",
                str(root),
                "--port",
                str(port),
                *(("--engine", engine) if engine else ()),
                *args,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            cwd=ROOT,
            start_new_session=True,
        )
    server = Server(process, root, f"http://127.0.0.1:{port}", log)
    wait_healthy(server, timeout)
    return server


def wait_healthy(server: Server, timeout: float = 30) -> None:
    """Wait until `server` answers /health (failing at once if its process exits)."""

    def healthy() -> bool:
        assert server.process.poll() is None, f"the server exited: {server.log.read_text()}"
        try:
            return httpx.get(f"{server.url}/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(healthy, "the server answers /health", timeout=timeout)


def continue_with(server: Server) -> str:
    """The command a stopped server's last line advises (`... Continue with: COMMAND`)."""
    last = server.log.read_text().splitlines()[-1]
    _, said, command = last.partition("Continue with: ")
    assert said, f"the server's last line gives no command: {last!r}"
    return command


def run_printed(
    command: str, root: Path, url: str, env: dict[str, str] | None = None, timeout: float = 30
) -> Server:
    """Run `command` exactly as printed, by a shell in the directory the first server ran in
    (with this virtual environment's `batchrun` first on PATH); wait for /health at `url`."""
    log = root.parent / f"{root.name}-printed.log"
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    with log.open("wb") as out:
        process = subprocess.Popen(
            command,
            shell=True,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {}), "PATH": path},
            cwd=ROOT,
            start_new_session=True,
        )
    server = Server(process, root, url, log)
    wait_healthy(server, timeout)
    return server


def stop_server(server: Server, sig: int = signal.SIGTERM) -> None:
    """Signal the server's whole process group and wait for it."""
    if server.process.poll() is None:
        os.killpg(server.process.pid, sig)
    server.process.wait(timeout=30)


def requests_file(path: Path, n: int, prefix: str = "req") -> Path:
    """A chat batch input file of `n` requests."""
    return write_jsonl(path, [chat_line(f"{prefix}-{i:04d}", f"hello {i}") for i in range(n)])


def create_batch(
    client: OpenAI,
    path: Path,
    window: str = "24h",
    endpoint: str = "/v1/chat/completions",
    **extra: Any,
) -> Batch:
    """Upload `path` and create a batch of it (a chat batch unless `endpoint` says otherwise)."""
    with path.open("rb") as f:
        uploaded = client.files.create(file=f, purpose="batch")
    return client.batches.create(
        input_file_id=uploaded.id,
        endpoint=endpoint,  # type: ignore[arg-type]
        completion_window=window,  # type: ignore[arg-type]
        **extra,
    )


def wait_done(client: OpenAI, batch_id: str, timeout: float = 30) -> Batch:
    """Poll a batch until it ends, as a client would."""
    seen: list[Batch] = []

    def ended() -> bool:
        seen.append(client.batches.retrieve(batch_id))
        return seen[-1].status in DONE

    wait_until(ended, f"batch {batch_id} ends", timeout=timeout, every=0.1)
    return seen[-1]


def lines_of(client: OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    """A file's JSONL lines, read through the API."""
    assert file_id is not None
    return [json.loads(x) for x in client.files.content(file_id).text.splitlines() if x.strip()]


# Two models for one server (tests/test_serve_models.py, tests/test_serve_model_set.py). SLOW: slow
# enough that the first batch still runs when the second one comes (2 requests of 40 ms at a
# time: about 50 requests a second).
TWO = ("--model", "a=org/a-model", "--model", "b=org/b-model")
SLOW = ("--batch-size", "2")
