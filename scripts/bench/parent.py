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
import time
from pathlib import Path

from batchrun.run.dedup import Duplicates
from batchrun.run.planner import DEFAULT_ORDER, plan
from batchrun.run.source import InputIndex, fast_requests
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


def input_stages(path: Path) -> dict[str, float]:
    """CPU seconds, measured here in one process, of the parent's input work on `path`, as a
    submit does it: the validating pass (which indexes the file), the run's second read of it
    (the index's fast pass), and the dispatch plan over that read (its windows' order and the
    duplicates held back; the read's own time taken out)."""
    index = InputIndex()
    t0 = time.process_time()
    for _ in index.read(path):
        pass
    t1 = time.process_time()
    for _ in fast_requests(path, index):
        pass
    t2 = time.process_time()
    for _ in plan(fast_requests(path, index), DEFAULT_ORDER, Duplicates()):
        pass
    t3 = time.process_time()
    return {"validation": t1 - t0, "second read": t2 - t1, "plan": max(0.0, t3 - t2 - (t2 - t1))}


def start_and_end_cpu(work: Path, line: str, workers: int) -> float:
    """The parent's CPU for a job of one line: what every submit costs whatever its size (the
    interpreter, imports, the workers' start and stop, the summary)."""
    one = work / "one.jsonl"
    one.write_text(line)
    job = work / "job-one"
    shutil.rmtree(job, ignore_errors=True)
    _wall, _rc, _rss, cpu = run_phase(
        ["submit", str(one), "--job-dir", str(job), "--engine", "echo",
         "--workers", str(workers), "--batch-size", "1024", "--no-progress"]
    )  # fmt: skip
    shutil.rmtree(job, ignore_errors=True)
    return cpu


def run(args: argparse.Namespace, work: Path, command: str, machine: dict[str, str]) -> int:
    """Submit the two jobs; print the table (and write it into the results)."""
    status = 0
    n, dims = args.requests, args.dimensions
    inputs = write_inputs(work, n, dims)
    head = ["job", "wall s", "requests/s", "parent CPU s", "parent CPU us/request",
            "job dir / float32", "journal, side file and shards / float32"]  # fmt: skip
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
            # The workers' bodies and vectors (job/shards.py).
            held += tree_bytes(job / "shards") if (job / "shards").exists() else 0
            dir_ratio = tree_bytes(job) / vectors
            sizes = [f"{dir_ratio:.3f}x", f"{held / vectors:.3f}x"]
        rows.append([kind + ("" if rc == 0 else f" (exit {rc})"), f"{wall:.2f}",
                     f"{n / wall:,.0f}", f"{cpu:.2f}", f"{per_request[kind]:.1f}", *sizes])  # fmt: skip
        shutil.rmtree(job, ignore_errors=True)
    # Where the parent's CPU goes, per request: the input work timed apart (above), the fixed
    # cost of any submit, and the rest (dispatch, receiving, counting and journaling results,
    # the summary), which is what workers writing their own results could take away.
    parts_head = ["job", "total us", "start and end (fixed) us", "validation us",
                  "second read us", "plan us", "the rest: results, dispatch, summary us"]  # fmt: skip
    parts_rows: list[list[str]] = []
    for kind in KINDS:
        with inputs[kind].open() as f:
            first = f.readline()
        fixed = start_and_end_cpu(work, first, args.workers)
        staged = input_stages(inputs[kind])
        us = {k: v / n * 1e6 for k, v in staged.items()}
        fixed_us = fixed / n * 1e6
        rest = per_request[kind] - fixed_us - sum(us.values())
        parts_rows.append([kind, f"{per_request[kind]:.1f}", f"{fixed_us:.1f}",
                           *(f"{us[k]:.1f}" for k in ("validation", "second read", "plan")),
                           f"{rest:.1f}"])  # fmt: skip
    met = all(x <= TARGET_US for x in per_request.values())
    # What one parent keeps up with: its own CPU a request, all of it (a parent with a core of
    # its own), and the results' part alone (were the input's work done elsewhere).
    rests = {row[0]: float(row[-1]) for row in parts_rows}
    lines = [
        "one parent keeps up with: "
        + ", ".join(
            f"{k} {1e6 / v:,.0f} requests/s ({1e6 / max(rests[k], 0.1):,.0f}/s on the results' part alone)"
            for k, v in per_request.items()
        ),
        "parent CPU per request: "
        + ", ".join(f"{k} {v:.1f} us" for k, v in per_request.items())
        + f" (target at most {TARGET_US:g}): "
        + ("met" if met else "NOT met"),
        f"embeddings job directory: {dir_ratio:.3f}x its vectors' float32 bytes (target at "
        f"most {TARGET_BYTES}x): " + ("met" if dir_ratio <= TARGET_BYTES else "NOT met"),
    ]
    print_table(head, rows)
    print()
    print_table(parts_head, parts_rows)
    print("\n".join(lines))
    if not args.no_docs:
        text = (
            "## The parent's own CPU per request (issue 50)\n\n"
            f"`{command}`; {machine_line(machine)}. {n:,} /v1/embeddings requests of "
            f"{dims:,} dimensions and {n:,} chat lines, echo engine, {args.workers} "
            "workers; the parent's CPU is the submit process's own (utime + stime, its "
            "threads included, its workers not).\n\n"
            + md_table(head, rows)
            + "\n\nWhere the parent's CPU goes, per request: the input's work timed apart in "
            "one process (validation, the run's second read, the dispatch plan), the fixed cost "
            "of any submit (a job of one line), and the rest by difference (dispatch, "
            "receiving, counting and journaling the results, the summary):\n\n"
            + md_table(parts_head, parts_rows)
            + "\n\n"
            + "\n".join(f"- {x}" for x in lines)
            + "\n"
        )
        write_results(__name__, "parent", text)
    return status
