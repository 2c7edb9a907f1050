"""Benchmark: the parent's own CPU per request, with the engine workers doing the rest (issue 50).

    .venv/bin/python scripts/bench_parent.py                       # 200,000 of each, 2 workers
    .venv/bin/python scripts/bench_parent.py --requests 20000 --no-docs

Two jobs of N requests each on the echo engine (instant answers: what is measured is batchrun's
own cost) with 2 engine workers: N /v1/embeddings lines of 1,024 dimensions (float and base64
alternating) and N chat lines answered with 8 tokens (scripts/bench_embeddings.py's inputs).
Each `submit` runs as a process of its own; the figure is that process's own CPU (utime +
stime of the parent alone, its threads included, its workers not: validation, scheduling,
journaling, counting), per request. Also the embeddings job's directory against its vectors'
float32 bytes (4 x D a request): every file in it, and the journal with its side file.
Target (issue 50): at most 8 us a request for both, and the job directory at most 1.15x.

Results are printed and, unless --no-docs, written to docs/benchmarks.md between
`<!-- bench:parent -->` and its closing marker.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from bench_embeddings import KINDS, write_inputs  # noqa: E402
from bench_harness import (  # noqa: E402
    DOCS,
    common_arguments,
    machine_line,
    md_table,
    print_table,
    replace_section,
    run_benchmark,
    the_command,
)
from bench_scale import run_phase  # noqa: E402

TARGET_US = 8.0
TARGET_BYTES = 1.15


def tree_bytes(path: Path) -> int:
    """The bytes of every file under `path`."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; print the table (and write it into docs/benchmarks.md)."""
    parser = argparse.ArgumentParser(
        prog="bench_parent.py", description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument("--requests", type=int, default=200_000, help="requests in each job")
    parser.add_argument("--dimensions", type=int, default=1024, help="each vector's size")
    parser.add_argument("--workers", type=int, default=2, help="engine workers")
    common_arguments(parser)
    args = parser.parse_args(argv)
    command = the_command(__file__, argv)
    status = [0]

    def body(work: Path, command: str, machine: dict[str, str]) -> None:
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
            status[0] |= rc
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
            replace_section(DOCS, "parent", text)

    run_benchmark(args.work_dir, command, body)
    return status[0]


if __name__ == "__main__":
    raise SystemExit(main())
