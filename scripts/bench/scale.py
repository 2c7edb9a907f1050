"""batchrun at scale with the echo engine: requests/s and the parent's peak memory.

    .venv/bin/python scripts/bench.py scale                        # 1M lines (and a 20k baseline)
    .venv/bin/python scripts/bench.py scale --sizes 20000 1000000 10000000
    .venv/bin/python scripts/bench.py scale --sizes 2000 20000 --no-docs
    .venv/bin/python scripts/bench.py scale --long-prompts      # 2,000 prompts of 250 KB (500 MB)

For each size, one job of short /v1/completions requests runs through every command a user runs
on a big job: submit (`--batch-size 1024`), status, resume (nothing left), retry-failed (nothing
failed), export --parquet, status --json again. Each command runs as a process of its own, and its
peak RSS is its own (`getrusage(RUSAGE_SELF)` in that process: the engine workers, its children,
are not counted): the parent's cost, what grows with the job. The parent's bytes per request are
the growth of each command's peak RSS from the smallest size to each larger one, over the
requests added (the goal: at most 40 bytes a request). status's time is also given against
`batchrun --help`'s (the goal: at most 2x).

Results are printed and, unless --no-docs, written to docs/benchmarks/results/scale.md (section
`bench:scale`).

--long-prompts instead submits a file of 2,000 chat requests of 250 KB each (500 MB; half prose,
half one long pasted blob) and prints the parent's peak RSS (the goal: under 300 MiB); with
docs, into `<!-- bench:long-prompts -->`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench.harness import (
    ROOT,
    machine_line,
    md_table,
    print_table,
    write_completion_requests,
    write_results,
)

# Runs batchrun's CLI in this process, then prints the process's own peak RSS (KiB; VmHWM, not
# ru_maxrss, which Linux carries over from the process that started it) on stderr.
_WRAP = (
    "import atexit, resource, sys\n"
    "from batchrun.peak_memory import peak_rss_kib\n"
    "atexit.register(lambda: sys.stderr.write("
    "'\\nBENCH_MAXRSS_KB=%d\\nBENCH_CPU_S=%f\\n' % (peak_rss_kib(),"
    " resource.getrusage(resource.RUSAGE_SELF).ru_utime"
    " + resource.getrusage(resource.RUSAGE_SELF).ru_stime)))\n"
    "from batchrun.cli import main\n"
    "sys.argv = ['batchrun', *sys.argv[1:]]\n"
    "main()\n"
)

PHASES = ["submit", "status", "resume", "retry-failed", "export --parquet", "status --json"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """This benchmark's options."""
    parser.add_argument("--sizes", type=int, nargs="+", default=[20_000, 1_000_000])
    parser.add_argument(
        "--long-prompts", action="store_true", help="2,000 prompts of 250 KB instead."
    )


def run_phase(args: list[str]) -> tuple[float, int, int, float]:
    """Run `batchrun ARGS` in a process of its own: (wall seconds, exit code, peak RSS KiB, CPU
    seconds of that process: what a shared machine's load does not inflate)."""
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", _WRAP, *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    wall = time.perf_counter() - start
    rss, cpu = 0, 0.0
    for line in proc.stderr.splitlines():
        if line.startswith("BENCH_MAXRSS_KB="):
            rss = int(line.split("=", 1)[1])
        if line.startswith("BENCH_CPU_S="):
            cpu = float(line.split("=", 1)[1])
    if proc.returncode not in (0, 1):
        sys.stderr.write(proc.stderr[-2000:])
    return wall, proc.returncode, rss, cpu


def measure(n: int, work: Path) -> dict[str, tuple[float, int, int, float]]:
    """Every phase of one job of `n` requests."""
    inp = work / f"in-{n}.jsonl"
    write_completion_requests(inp, n)
    job = work / f"job-{n}"
    out = work / f"out-{n}"
    results = {}
    for phase in PHASES:
        words = phase.split()
        if words[0] == "submit":
            args = ["submit", str(inp), "--job-dir", str(job), "--engine", "echo",
                    "--batch-size", "1024", "--no-progress"]  # fmt: skip
        elif words[0] == "export":
            args = ["export", "--job-dir", str(job), "--output-dir", str(out), *words[1:]]
        elif words[0] in ("resume", "retry-failed"):
            args = [words[0], "--job-dir", str(job), "--no-progress"]
        else:
            args = [words[0], "--job-dir", str(job), *words[1:]]
        results[phase] = run_phase(args)
    inp.unlink()
    shutil.rmtree(job, ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)
    return results


def write_long_prompts(path: Path, lines: int, chars: int) -> None:
    """`lines` chat requests of about `chars` characters each: half prose, half one pasted blob."""
    prose = "The committee met on a Tuesday and read the long report again, page by page. "
    with path.open("w") as f:
        for i in range(lines):
            if i % 2 == 0:
                text = f"Document {i}. " + prose * (chars // len(prose))
            else:
                text = os.urandom(chars // 2).hex()  # one word of `chars` characters
            body = {
                "model": "m",
                "max_tokens": 4,
                "temperature": 0,
                "messages": [{"role": "user", "content": "Summarize: " + text}],
            }
            line = {"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions"}
            f.write(json.dumps({**line, "body": body}) + "\n")


def long_prompts(work: Path, docs: bool, command: str, machine: dict[str, str]) -> int:
    """Submit 2,000 prompts of 250 KB; print the parent's peak RSS (goal: under 300 MiB)."""
    lines, chars = 2_000, 250_000
    src = work / "long.jsonl"
    write_long_prompts(src, lines, chars)
    size_mb = src.stat().st_size / 1e6
    args = ["submit", str(src), "--job-dir", str(work / "job"), "--engine", "echo",
            "--no-progress", "--batch-size", "256", "--max-model-len", "1000000"]  # fmt: skip
    wall, rc, rss, _cpu = run_phase(args)
    mib = rss / 1024
    print(f"{lines:,} prompts of {chars:,} characters ({size_mb:,.0f} MB): exit {rc}, "
          f"{wall:.1f} s, parent peak RSS {mib:,.0f} MiB (goal: under 300)")  # fmt: skip
    if docs:
        body = (
            "## Long prompts: the parent's peak memory\n\n"
            f"`{command}`; {machine_line(machine)}. {lines:,} chat requests of {chars:,} characters "
            f"({size_mb:,.0f} MB; half prose, half one long pasted blob), echo engine, "
            "`--batch-size 256`: the parent's own peak RSS (its engine worker not counted) "
            f"{mib:,.0f} MiB (goal: under 300 MiB), exit {rc}, {wall:.1f} s.\n"
        )
        write_results(__name__, "long-prompts", body)
    return 0 if rc == 0 else 1


def run(args: argparse.Namespace, work: Path, command: str, machine: dict[str, str]) -> int:
    """Run the benchmark; print the table (and write it into the results)."""
    if args.long_prompts:
        return long_prompts(work, not args.no_docs, command, machine)
    sizes = sorted(set(args.sizes))
    helps = [run_phase(["--help"])[3] for _ in range(3)]
    help_s = sorted(helps)[1]
    measured = {n: measure(n, work) for n in sizes}
    base = sizes[0]
    head = ["requests", "command", "wall s", "CPU s", "requests/s", "peak RSS MiB", "bytes/request"]
    rows: list[list[str]] = []
    for n in sizes:
        for phase in PHASES:
            wall, rc, rss, cpu = measured[n][phase]
            grown = ""
            if n != base:
                added = (rss - measured[base][phase][2]) * 1024 / (n - base)
                grown = f"{added:,.1f}"
            rate = f"{n / wall:,.0f}" if phase in ("submit", "export --parquet") else ""
            note = f" ({cpu / help_s:.1f}x --help)" if phase.startswith("status") else ""
            rows.append([f"{n:,}", phase + ("" if rc == 0 else f" (exit {rc})"), f"{wall:.2f}",
                         f"{cpu:.2f}{note}", rate, f"{rss / 1024:,.1f}", grown])  # fmt: skip
    print(f"batchrun --help: {help_s:.2f} CPU s")
    print_table(head, rows)
    if not args.no_docs:
        body = (
            "## At scale: the parent's memory per request, status against --help\n\n"
            f"`{command}`; {machine_line(machine)}. Each command a process of its own; peak RSS is that "
            "process's own (its engine workers not counted); bytes/request: its growth from "
            f"{base:,} requests, over the requests added (goal: at most 40). "
            f"`batchrun --help`: {help_s:.2f} CPU s (status goal: at most 2x; CPU time, which "
            "a shared machine's load does not inflate as it does wall time).\n\n"
            + md_table(head, rows)
        )
        write_results(__name__, "scale", body)
    print(json.dumps({"help_s": help_s}))
    return 0
