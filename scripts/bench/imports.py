"""What `import batchrun` and the API's first use cost a Python process (issue 52).

    .venv/bin/python scripts/bench.py import                # 30 runs of each, results written
    .venv/bin/python scripts/bench.py import --runs 5 --no-docs

Against the interpreter's own start (the Python API must keep the import cheap).

Each contender is a fresh `python -c CODE` process, timed from launch to exit, `--runs` times,
interleaved (one of each in turn, so that a busy moment of the machine falls on all alike):

- `python -c pass`: the interpreter's start, the floor;
- `import batchrun`: the package (its version, BatchrunError; the API not yet);
- `import batchrun; batchrun.Job`: the API's first use (batchrun/api/ and the core it calls,
  still no vLLM, torch, pandas or pyarrow);
- `import batchrun.cli`: the command line's modules, for scale.

batchrun's modules are compiled first (as `scripts/test.sh` does and an install does), so no
run pays for compiling them. Each row also lists the heavy modules the code left imported
(none of vLLM, torch, pandas, pyarrow for `import batchrun` is the promise). Results are printed
and written to docs/benchmarks/results/import.md (section `bench:import`).
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.harness import (
    ROOT,
    machine_line,
    md_table,
    print_table,
    write_results,
)

HEAVY = ("vllm", "torch", "pandas", "pyarrow", "numpy", "typer", "batchrun.api")
CONTENDERS = {
    "python -c pass": "pass",
    "import batchrun": "import batchrun",
    "import batchrun; batchrun.Job": "import batchrun; batchrun.Job",
    "import batchrun.cli": "import batchrun.cli",
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """This benchmark's options."""
    p.add_argument("--runs", type=int, default=30, help="processes per contender")


def timed(code: str) -> float:
    """Seconds from launch to exit of `python -c code`."""
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)
    return time.perf_counter() - started


def left_imported(code: str) -> list[str]:
    """The heavy modules `code` leaves imported."""
    probe = (
        f"{code}\nimport json, sys\nprint(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, check=True, capture_output=True, text=True
    )
    found: list[str] = json.loads(out.stdout)
    return found


def measure(runs: int) -> dict[str, list[float]]:
    """Each contender's wall times, the contenders interleaved run by run."""
    times: dict[str, list[float]] = {name: [] for name in CONTENDERS}
    for code in CONTENDERS.values():
        timed(code)  # warm the page cache, untimed
    for _ in range(runs):
        for name, code in CONTENDERS.items():
            times[name].append(timed(code))
    return times


def run(args: argparse.Namespace, work: Path, command: str, machine: dict[str, str]) -> None:
    """Time the contenders; print the table (and write it into the results)."""
    compileall.compile_dir(ROOT / "batchrun", quiet=1)
    load_before = os.getloadavg()[0]
    times = measure(args.runs)
    load_after = os.getloadavg()[0]
    floor = statistics.median(times["python -c pass"])
    watched = ", ".join(HEAVY)
    head = ["code", "median", "min", "max", "over `python -c pass`", f"of {watched}: imported"]
    rows = []
    for name, code in CONTENDERS.items():
        median = statistics.median(times[name])
        heavy = left_imported(code) if code != "pass" else []
        rows.append(
            [
                f"`{name}`",
                f"{median * 1000:.0f} ms",
                f"{min(times[name]) * 1000:.0f} ms",
                f"{max(times[name]) * 1000:.0f} ms",
                "-" if code == "pass" else f"+{(median - floor) * 1000:.0f} ms",
                ", ".join(heavy) or "none",
            ]
        )
    print_table(head, rows)
    if args.no_docs:
        return
    text = "\n".join(
        [
            "## `import batchrun`: what the package costs a Python process",
            "",
            f"`{command}`; {args.runs} processes of each, interleaved, wall time from "
            "launch to exit, batchrun's modules compiled; load average "
            f"{load_before:.1f} before, {load_after:.1f} after ({os.cpu_count()} cores).",
            f"Machine: {machine_line(machine)}",
            "",
            md_table(head, rows),
            "",
            "The Python API (`batchrun.run`, `batchrun.submit`, `batchrun.Job`) is imported "
            "on first use (batchrun/__init__.py), and nothing of it imports vLLM, torch, "
            "pandas or pyarrow until a job, its results or its DataFrame need them.",
        ]
    )
    write_results(__name__, "import", text)
