"""The crash harness's serve part (scripts/chaos.py --serve N): kill `batchrun serve` with SIGKILL
between making a batch's output file and saving its id in the batch's record, and at random
moments while batches run, restart it on the same root, and check that every batch ends with
each of its files made once.

Each of the N cycles creates a batch (valid requests, a few invalid lines, so it has an output
file and an error file) on a server started with BATCHRUN_SERVE_PAUSE_AFTER_OUTPUT_S (the
finisher waits there after making each file); every other cycle the server is first killed at a
random moment while the batch runs, and restarted. The harness waits until a file named for the
batch is on record while the batch's record lacks its id, kills the server's whole process
group, restarts it without the pause, and checks:

- the batch ends completed, with an output_file_id and an error_file_id;
- exactly one file of each (by its filename `<batch>_output.jsonl`, `<batch>_errors.jsonl`) is
  listed by GET /v1/files and on disk, the one the batch names;
- no file's bytes are left without a record, no temporary upload is left;
- the output holds each valid custom_id once, the error file each invalid line once.

It drives the server over HTTP and reads its root; it imports nothing from batchrun.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

PAUSE_ENV = "BATCHRUN_SERVE_PAUSE_AFTER_OUTPUT_S"
TERMINAL = ("completed", "failed", "expired", "cancelled")
SERVE = (sys.executable, "-m", "batchrun", "serve", "--engine", "echo", "--batch-size", "4")


class ServeChaos:
    """N cycles of kills around a served batch's finish; violations listed."""

    def __init__(self, args: argparse.Namespace, work: Path, env: dict[str, str]) -> None:
        self.args, self.work, self.env = args, work, env
        self.rng = random.Random(args.seed)
        self.root = work / "serve-root"
        self.violations: list[str] = []
        self.kills = {"output_window": 0, "random": 0}
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""

    def start(self, pause: bool) -> None:
        """Start the server (the finisher pausing after each output file when `pause`)."""
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = {**self.env, "BATCHRUN_ECHO_DELAY_MS": str(self.args.delay_ms)}
        if pause:
            env[PAUSE_ENV] = "60"
        log = (self.work / "serve.log").open("ab")
        self.proc = subprocess.Popen(
            [*SERVE, "--root", str(self.root), "--port", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        log.close()
        self.url = f"http://127.0.0.1:{port}"
        self._wait(lambda: self._get("/health") is not None, "the server answers /health", 60)

    def kill(self) -> None:
        """SIGKILL the server's whole process group."""
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def cycle(self, n: int) -> None:
        """One batch, killed in its output window (and at a random moment first, every other)."""
        valid = self.args.serve_requests
        lines = [_chat(f"c{n}-r{i}", f"text {n} {i}") for i in range(valid)]
        invalid = 3
        for k in range(invalid):
            lines.insert(self.rng.randrange(len(lines) + 1), f"not json {n} {k}")
        self.start(pause=True)
        file_id = self._upload("\n".join(lines) + "\n")
        batch_id = self._post(
            "/v1/batches",
            {
                "input_file_id": file_id,
                "endpoint": "/v1/chat/completions",
                "completion_window": "24h",
            },
        )["id"]
        if n % 2 == 1:
            time.sleep(self.rng.uniform(0.05, valid * self.args.delay_ms / 4000))
            self.kill()
            self.kills["random"] += 1
            self.start(pause=True)
        self._wait(lambda: self._in_window(batch_id), f"{batch_id} makes an output file", 120)
        self.kill()
        self.kills["output_window"] += 1
        self.start(pause=False)
        try:
            self._wait(lambda: self._ended(batch_id), f"{batch_id} ends after the restart", 120)
            self.check(batch_id, valid, invalid)
        finally:
            self.kill()

    def _in_window(self, batch_id: str) -> bool:
        """A file of the batch is on record while the batch's record names none."""
        made = [f for f in self._file_records() if f["filename"].startswith(batch_id)]
        record = json.loads((self.root / "batches" / batch_id / "batch.json").read_text())
        named = {record["batch"].get("output_file_id"), record["batch"].get("error_file_id")}
        return any(f["id"] not in named for f in made)

    def _ended(self, batch_id: str) -> bool:
        got = self._get(f"/v1/batches/{batch_id}")
        return got is not None and got["status"] in TERMINAL

    def check(self, batch_id: str, valid: int, invalid: int) -> None:
        """The invariants of one cycle (see the module's docstring)."""
        batch = self._get(f"/v1/batches/{batch_id}")
        assert batch is not None
        if batch["status"] != "completed":
            self.violations.append(f"{batch_id} ended {batch['status']}, not completed")
            return
        listed = (self._get("/v1/files?limit=10000") or {}).get("data", [])
        for key, label, want in (
            ("output_file_id", "output", valid),
            ("error_file_id", "errors", invalid),
        ):
            name = f"{batch_id}_{label}.jsonl"
            named = batch.get(key)
            api = [f["id"] for f in listed if f["filename"] == name]
            disk = [f["id"] for f in self._file_records() if f["filename"] == name]
            if api != [named] or disk != [named]:
                self.violations.append(
                    f"{batch_id}: {label} files listed {api}, on disk {disk}; the batch names "
                    f"{named}"
                )
                continue
            text = httpx.get(f"{self.url}/v1/files/{named}/content", timeout=30).text
            rows = [json.loads(x) for x in text.splitlines() if x.strip()]
            if label == "output":
                ids = [r["custom_id"] for r in rows]
                if sorted(ids) != sorted({*ids}) or len(ids) != want:
                    self.violations.append(f"{batch_id}: output has {len(ids)} lines, want {want}")
            elif len(rows) != want:
                self.violations.append(f"{batch_id}: errors has {len(rows)} lines, want {want}")
        files = self.root / "files"
        bare = [p.name for p in files.glob("*.jsonl") if not p.with_suffix(".json").exists()]
        temps = [p.name for p in files.glob(".upload-*")]
        if bare or temps:
            self.violations.append(f"left in files/: {bare + temps}")

    def _file_records(self) -> list[dict[str, Any]]:
        out = []
        for meta in (self.root / "files").glob("file-*.json"):
            try:
                out.append(json.loads(meta.read_text()))
            except (OSError, ValueError):
                continue  # being written
        return out

    def _get(self, path: str) -> Any:
        try:
            answer = httpx.get(self.url + path, timeout=10)
        except httpx.HTTPError:
            return None
        return answer.json() if answer.status_code == 200 else None

    def _post(self, path: str, body: dict[str, Any]) -> Any:
        answer = httpx.post(self.url + path, json=body, timeout=30)
        answer.raise_for_status()
        return answer.json()

    def _upload(self, text: str) -> str:
        answer = httpx.post(
            self.url + "/v1/files",
            files={"file": ("input.jsonl", text.encode())},
            data={"purpose": "batch"},
            timeout=30,
        )
        answer.raise_for_status()
        return str(answer.json()["id"])

    def _wait(self, condition: Any, what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"the server exited while waiting until {what}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out waiting until {what}")
            time.sleep(0.02)

    def main(self) -> dict[str, Any]:
        """Run every cycle; the figures and violations."""
        started = time.monotonic()
        for n in range(self.args.serve):
            self.cycle(n)
            if not self.args.quiet:
                print(f"serve cycle {n + 1}/{self.args.serve}: {len(self.violations)} violations")
        return {
            "serve_cycles": self.args.serve,
            "serve_kills": self.kills,
            "seconds": round(time.monotonic() - started, 1),
            "violations": self.violations,
        }


def _chat(cid: str, text: str) -> str:
    return json.dumps(
        {
            "custom_id": cid,
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": "m", "messages": [{"role": "user", "content": text}]},
        }
    )


def run(args: argparse.Namespace, work: Path, env: dict[str, str]) -> int:
    """scripts/chaos.py --serve: print and report the figures; 0 clean, 1 on violations."""
    print(f"seed {args.seed}; serve root {work / 'serve-root'}")
    report = ServeChaos(args, work, env).main()
    print(json.dumps(report, indent=2))
    if args.report:
        Path(args.report).write_text(json.dumps(report, indent=2))
    return 1 if report["violations"] else 0
