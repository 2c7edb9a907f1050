"""A real `vllm serve` (vLLM's OpenAI-compatible server) on 127.0.0.1 for the remote engine's
tests (tests/vllm/test_remote_vllm.py): the embedded default model, converted once, served on the
CPU as docs/remote.md says; started once per test session, killed and started again on the
same port by the test of a server restart."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from support.ports import free_port

# The name the server answers to; lines naming no model are sent with it.
SERVED_NAME = "m"
# Its KV cache: 1 GiB, as the suite's own engines (conftest.py TEST_KV_CACHE_BYTES), not vLLM's
# share of the machine's memory.
KV_CACHE_BYTES = 1 << 30
# Its start takes about 60 s on 2 cores (ENVIRONMENT.md); more under the suite's load.
START_TIMEOUT_S = 600.0


@dataclass
class VllmServe:
    """One `vllm serve` process group, its port kept across restarts."""

    model: Path
    log: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def root(self) -> str:
        """http://127.0.0.1:PORT, for a proxy."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        """The server's OpenAI base URL (--base-url)."""
        return self.root + "/v1"

    def start(self) -> None:
        """Start the server and wait until it answers /health."""
        command = [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.model),
            "--served-model-name", SERVED_NAME, "--dtype", "float32", "--max-model-len", "2048",
            "--enforce-eager", "--kv-cache-memory-bytes", str(KV_CACHE_BYTES), "--host", "127.0.0.1",
            "--port", str(self.port),
        ]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHRUN_")}
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        self.starts += 1
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.healthy():
            if self.proc.poll() is not None:
                tail = self.log.read_text(errors="replace")[-3000:]
                raise AssertionError(f"vllm serve exited ({self.proc.returncode}): {tail}")
            if time.monotonic() > deadline:
                raise AssertionError(f"vllm serve did not start in {START_TIMEOUT_S:g} s")
            time.sleep(1)

    def healthy(self) -> bool:
        """Whether GET /health answers 200."""
        try:
            with urllib.request.urlopen(self.root + "/health", timeout=2) as reply:
                return bool(reply.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def kill(self) -> None:
        """SIGKILL the server with every process it started (its engine core)."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.proc = None

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST a body straight to the server (no batchrun, no proxy); its JSON answer."""
        request = urllib.request.Request(
            self.url + path,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=300) as reply:
            answer: dict[str, Any] = json.loads(reply.read())
            return answer
