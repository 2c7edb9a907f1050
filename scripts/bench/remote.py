"""The remote engine (`--base-url`) against a client posting at a fixed concurrency (issue 48).

    .venv/bin/python scripts/bench.py remote                       # starts a vllm serve itself
    .venv/bin/python scripts/bench.py remote --base-url http://127.0.0.1:8000/v1 --requests 150
    .venv/bin/python scripts/bench.py remote --requests 60 --concurrency 16,64 --no-docs

batchrun against an asyncio client posting every line at a fixed concurrency, side by side on one
warm server.

The server is warmed first (a few requests, untimed). Then, `--rounds` times, each contender
runs the same chat lines (varied prompts, max_tokens 8-128, temperature 0; `--duplicates`
makes that share of them copies of other lines, which batchrun runs once):

- fixed-N: one Python process with an aiohttp session posting every line with at most N in
  flight, N from `--concurrency` (16, 64, 256), timed from launch to its last answer;
- batchrun: `batchrun submit IN.jsonl --base-url URL` timed from launch to exit (job created,
  input validated, every answer journaled and fsync'd, the manifest written).

The ratio is the best fixed concurrency's wall time over batchrun's (1.0: as fast as the best
fixed client; the issue's target is at least 0.95). Results are printed and written to
docs/benchmarks/results/remote.md (section `bench:remote`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench.harness import (
    _f,
    _x,
    batchrun_cmd,
    default_model_dir,
    machine_line,
    make_chat_requests,
    md_table,
    print_table,
    write_results,
)

SERVED = "m"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """This benchmark's options."""
    p.add_argument("--base-url", default=None, help="a running server (default: start one)")
    p.add_argument("--requests", type=int, default=150, help="chat lines per contender")
    p.add_argument("--concurrency", default="16,64,256", help="the fixed clients' concurrencies")
    p.add_argument("--rounds", type=int, default=1, help="runs of every contender, interleaved")
    p.add_argument(
        "--duplicates", type=float, default=0.0, help="share of lines that copy another line"
    )


def _lines(n: int, duplicates: float) -> list[dict[str, Any]]:
    lines = make_chat_requests(n, seed=48)
    for line in lines:
        line["body"].pop("model", None)  # the server's one model is filled in
    rng = random.Random(4848)
    for i in range(1, n):
        if rng.random() < duplicates:
            lines[i]["body"] = json.loads(json.dumps(lines[rng.randrange(i)]["body"]))
    return lines


async def _fixed(url: str, bodies: list[dict[str, Any]], concurrency: int) -> tuple[int, int]:
    """Post every body with at most `concurrency` in flight; (answers, generated tokens)."""
    import aiohttp

    gate = asyncio.Semaphore(concurrency)
    tokens = ok = 0
    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=3600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def one(body: dict[str, Any]) -> None:
            nonlocal tokens, ok
            async with gate, session.post(url + "/chat/completions", json=body) as reply:
                answer = await reply.json()
                if reply.status == 200:
                    ok += 1
                    tokens += answer["usage"]["completion_tokens"]

        await asyncio.gather(*(one(b) for b in bodies))
    return ok, tokens


def _served(url: str) -> str:
    """The server's first model: what the fixed clients name (batchrun fills in the same)."""
    with urllib.request.urlopen(url + "/models", timeout=30) as reply:
        name: str = json.loads(reply.read())["data"][0]["id"]
        return name


def _run_fixed(url: str, lines: list[dict[str, Any]], concurrency: int) -> dict[str, Any]:
    model = _served(url)
    bodies = [{**line["body"], "model": model} for line in lines]
    started = time.monotonic()
    ok, tokens = asyncio.run(_fixed(url, bodies, concurrency))
    return {"wall_s": time.monotonic() - started, "ok": ok, "tokens": tokens}


def _run_batchrun(url: str, src: Path, job: Path) -> dict[str, Any]:
    command = [*batchrun_cmd(), "submit", str(src), "--job-dir", str(job), "--base-url", url]
    started = time.monotonic()
    done = subprocess.run([*command, "--no-progress"], capture_output=True, text=True)
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"batchrun failed: {done.stderr[-2000:]}")
    manifest = json.loads((job / "manifest.json").read_text())
    return {
        "wall_s": wall,
        "ok": manifest["counts"]["succeeded"],
        "tokens": manifest["tokens"]["completion"],
        "window": manifest.get("batch_size"),
    }


def _start_server(work: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = 18000 + os.getpid() % 1000
    log = (work / "vllm-serve.log").open("wb")
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model",
        default_model_dir(), "--served-model-name", SERVED, "--dtype", "float32",
        "--max-model-len", "2048", "--enforce-eager", "--gpu-memory-utilization", "0.3",
        "--host", "127.0.0.1", "--port", str(port),
    ]  # fmt: skip
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2):
                return proc, url + "/v1"
        except OSError:
            if proc.poll() is not None:
                raise SystemExit(f"vllm serve exited; see {work / 'vllm-serve.log'}") from None
            time.sleep(1)
    raise SystemExit("vllm serve did not start in 900 s")


def run(args: argparse.Namespace, work: Path, command: str, machine: dict[str, str]) -> None:
    """Warm the server, run every contender `--rounds` times, print and record the ratios."""
    server = None
    url = args.base_url
    if url is None:
        server, url = _start_server(work)
    try:
        lines = _lines(args.requests, args.duplicates)
        src = work / "remote.jsonl"
        src.write_text("".join(json.dumps(line) + "\n" for line in lines))
        _run_fixed(url, lines[:8], 8)  # warm: the server's first requests are slow
        levels = [int(c) for c in args.concurrency.split(",")]
        results: dict[str, list[dict[str, Any]]] = {}
        for r in range(args.rounds):
            for c in levels:
                found = _run_fixed(url, lines, c)
                results.setdefault(f"fixed-{c}", []).append(found)
                print(f"round {r + 1}: fixed-{c}: {found['wall_s']:.1f} s")
            found = _run_batchrun(url, src, work / f"job-{r}")
            results.setdefault("batchrun", []).append(found)
            print(f"round {r + 1}: batchrun: {found['wall_s']:.1f} s (window {found['window']})")
    finally:
        if server is not None:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
    _report(args, results, command, machine)


def _report(
    args: argparse.Namespace,
    results: dict[str, list[dict[str, Any]]],
    command: str,
    machine: dict[str, str],
) -> None:
    best = {name: min(rs, key=lambda x: x["wall_s"]) for name, rs in results.items()}
    fixed = [n for n in best if n.startswith("fixed-")]
    baseline = min(fixed, key=lambda n: best[n]["wall_s"])
    head = ["contender", "wall s (best)", "req/s", "gen tok/s", "answers", "vs best fixed"]
    rows = []
    for name, found in best.items():
        wall = found["wall_s"]
        ratio = best[baseline]["wall_s"] / wall if wall else None
        label = name + (f" (window {found['window']})" if name == "batchrun" else "")
        rows.append(
            [
                label,
                _f(wall),
                _f(args.requests / wall if wall else None),
                _f(found["tokens"] / wall if wall else None),
                str(found["ok"]),
                _x(ratio),
            ]
        )
    print()
    print_table(head, rows)
    if args.no_docs:
        return
    dup = f", {args.duplicates:.0%} duplicated lines" if args.duplicates else ""
    body = "\n".join(
        [
            "## The remote engine against a fixed-concurrency client (issue 48)",
            "",
            f"`{command}`",
            "",
            f"Machine: {machine_line(machine)}. {args.requests} chat lines (max_tokens 8-128, "
            f"temperature 0{dup}) on one warm `vllm serve` (CPU, the default model), "
            f"{args.rounds} round(s), contenders interleaved; best wall time of each. Baseline: "
            f"the best fixed concurrency ({baseline}); batchrun's wall time is its whole "
            "`submit`, launch to exit.",
            "",
            md_table(head, rows),
        ]
    )
    write_results(__name__, "remote", body)
