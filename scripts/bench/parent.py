"""The parent's own CPU per request, with the engine workers doing the rest (issue 50).

    .venv/bin/python scripts/bench.py parent                       # 200,000 of each, 2 workers
    .venv/bin/python scripts/bench.py parent --requests 20000 --no-docs

Two jobs of N requests each on the echo engine (instant answers: what is measured is batchrun's
own cost) with 2 engine workers: N /v1/embeddings lines of 1,024 dimensions (float and base64
alternating) and N chat lines answered with 8 tokens (the embeddings benchmark's inputs).
Each `submit` runs as a process of its own; the figure is that process's own CPU (utime +
stime of the parent alone, its threads included, its workers not: validation, scheduling,
journaling, counting), per request. Also the embeddings job's directory against its vectors'
float32 bytes (4 x D a request): every file in it, and the journal with its side file.
Target (issue 50): at most 8 us a request for both, and the job directory at most 1.15x.

Results are printed and, unless --no-docs, written to docs/benchmarks/results/parent.md
(section `bench:parent`).
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from bench.embeddings import KINDS, write_inputs
from bench.harness import (
    machine_line,
    md_table,
    print_table,
    write_results,
)
from bench.scale import run_phase

TARGET_US = 8.0
TARGET_BYTES = 1.15


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """This benchmark's options."""
    parser.add_argument("--requests", type=int, default=200_000, help="requests in each job")
    parser.add_argument("--dimensions", type=int, default=1024, help="each vector's size")
    parser.add_argument("--workers", type=int, default=2, help="engine workers")


def tree_bytes(path: Path) -> int:
    """The bytes of every file under `path`."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def run(args: argparse.Namespace, work: Path, command: str, machine: dict[str, str]) -> int:
    """Submit the two jobs; print the table (and write it into the results)."""
    status = 0
    n, dims = args.requests, args.dimensions
    inputs = write_inputs(work, n, dims)
    head = ["job", "wall s", "requests/s", "parent CPU s", "parent CPU us/request",
            "job dir / float32", "journal + side file / float32"]  # fmt: skip
    rows: list[list[str]] = []
    per_request: dict[str, float] = {}
    dir_ratio = 0.0
    for kind in KINDS:
        job = work / f"job-{kind}"
        shutil.rmtree(job, ignore_errors=True)
        wall, rc, _rss, cpu = run_phase(
            ["submit", str(inputs[kind]), "--job-dir", str(job), "--engine", "echo",
             "--workers", str(args.workers), "--batch-size", "1024", "--no-progress"]
        )  # fmt: skip
        status |= rc
        per_request[kind] = cpu / n * 1e6
        sizes = ["", ""]
        if kind == "embeddings":
            vectors = 4 * dims * n
            side = job / "journal.f32"
            held = (job / "journal.jsonl").stat().st_size + (
                side.stat().st_size if side.exists() else 0
            )
            dir_ratio = tree_bytes(job) / vectors
            sizes = [f"{dir_ratio:.3f}x", f"{held / vectors:.3f}x"]
        rows.append([kind + ("" if rc == 0 else f" (exit {rc})"), f"{wall:.2f}",
                     f"{n / wall:,.0f}", f"{cpu:.2f}", f"{per_request[kind]:.1f}", *sizes])  # fmt: skip
        shutil.rmtree(job, ignore_errors=True)
    met = all(x <= TARGET_US for x in per_request.values())
    lines = [
        "parent CPU per request: "
        + ", ".join(f"{k} {v:.1f} us" for k, v in per_request.items())
        + f" (target at most {TARGET_US:g}): "
        + ("met" if met else "NOT met"),
        f"embeddings job directory: {dir_ratio:.3f}x its vectors' float32 bytes (target at "
        f"most {TARGET_BYTES}x): " + ("met" if dir_ratio <= TARGET_BYTES else "NOT met"),
    ]
    print_table(head, rows)
    print("\n".join(lines))
    if not args.no_docs:
        text = (
            "## The parent's own CPU per request (issue 50)\n\n"
            f"`{command}`; {machine_line(machine)}. {n:,} /v1/embeddings requests of "
            f"{dims:,} dimensions and {n:,} chat lines, echo engine, {args.workers} "
            "workers; the parent's CPU is the submit process's own (utime + stime, its "
            "threads included, its workers not).\n\n"
            + md_table(head, rows)
            + "\n\n"
            + "\n".join(f"- {x}" for x in lines)
            + "\n"
        )
        write_results(__name__, "parent", text)
    return status
