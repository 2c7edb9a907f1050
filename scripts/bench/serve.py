"""The cost of GET /v1/batches and GET /metrics of `batchrun serve` with many stored batches.

    .venv/bin/python scripts/bench.py serve                 # 1,000 batches, 300 requests each
    .venv/bin/python scripts/bench.py serve --batches 5000 --requests 500 --json out.json

It writes `--batches` ended batch records into a fresh server root (as the server writes them,
through its BatchStore), starts `batchrun serve` on it (echo engine: no model is loaded), and
times each path `--requests` times from one keep-alive client, after a warm-up; it prints the
median and the 90th percentile in milliseconds. Both should cost the same with 10 or 10,000
batches: a page copies only what it shows, and /metrics reads counts kept with the records.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

from bench.harness import ROOT

WRITES_RESULTS = False
SERVE = (sys.executable, "-m", "batchrun", "serve", "--engine", "echo")
PATHS = ("/v1/batches", "/v1/batches?limit=100", "/metrics")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """This benchmark's options."""
    parser.add_argument("--batches", type=int, default=1000)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--json", type=Path, help="write the figures here as JSON")


def fill(root: Path, n: int) -> None:
    """`n` completed batches of 1,000 requests each in `root` (each record written once)."""
    from batchrun.serve.batches import BatchRecord, BatchStore, new_batch
    from batchrun.serve.ids import new_batch_id

    store = BatchStore(root)
    for i in range(n):
        batch = new_batch(
            new_batch_id(), "file-" + "0" * 24, "/v1/chat/completions", "24h", 86400, None, "m"
        )
        now = int(batch["created_at"])
        batch.update(
            status="completed",
            in_progress_at=now,
            finalizing_at=now,
            completed_at=now,
            request_counts={"total": 1000, "completed": 990 + i % 10, "failed": 10 - i % 10},
        )
        store.add(BatchRecord(batch))


def free_port() -> int:
    """A port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def timings(url: str, path: str, n: int) -> list[float]:
    """`n` round trips of GET `path`, in milliseconds (after 20 not counted)."""
    out: list[float] = []
    with httpx.Client(base_url=url, timeout=30) as client:
        for i in range(n + 20):
            started = time.perf_counter()
            answer = client.get(path)
            elapsed = (time.perf_counter() - started) * 1000
            answer.raise_for_status()
            if i >= 20:
                out.append(elapsed)
    return out


def run(args: argparse.Namespace, work: Path, command: str, machine: dict[str, str]) -> int:
    """Run the benchmark; print (and with --json write) the figures."""
    root = work / "root"
    started = time.monotonic()
    fill(root, args.batches)
    print(f"{args.batches} batches written in {time.monotonic() - started:.1f}s")
    port = free_port()
    server = subprocess.Popen(
        [*SERVE, "--root", str(root), "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=ROOT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                print("the server did not start", file=sys.stderr)
                return 2
            time.sleep(0.1)
        figures: dict[str, dict[str, float]] = {}
        for path in PATHS:
            ms = timings(url, path, args.requests)
            figures[path] = {
                "median_ms": round(statistics.median(ms), 2),
                "p90_ms": round(statistics.quantiles(ms, n=10)[-1], 2),
            }
            print(
                f"{path:28} median {figures[path]['median_ms']:6.2f} ms   "
                f"p90 {figures[path]['p90_ms']:6.2f} ms   ({args.requests} requests)"
            )
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
    if args.json:
        args.json.write_text(json.dumps({"batches": args.batches, "paths": figures}, indent=2))
    return 0
