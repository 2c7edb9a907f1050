"""batchrun's own overhead with the echo engine, no model, against a Python floor (part B).

    .venv/bin/python scripts/bench.py overhead                          # a million requests
    .venv/bin/python scripts/bench.py overhead --quick --no-docs        # 20,000
    .venv/bin/python scripts/bench.py overhead --overhead-requests 200000 --no-docs

Part B measures batchrun's own overhead with the echo engine (no model): submit, export and
export --parquet of a million short completion requests, with wall time and peak memory per phase,
against the floor of any Python tool on the same file, in a process of its own: per line, read,
`json.loads`, build the OpenAI batch output record, `json.dumps`, write (`child_floor`).
batchrun's phases are timed as a user times them, whole processes from launch to exit (the
interpreter's start, imports, the worker's start and its shutdown included); the floor is its
loop alone, timed inside its process from opening the input to closing the output (the
interpreter's start and imports not counted: the least a Python tool could take). Each phase's
wall time is also given as a ratio to the floor's (the median of `--floor-runs` runs, spread
between the phases); the targets: submit + export (JSONL) within 3x the floor, and every phase's
process tree under 512 MiB of peak RSS.

Results are printed and written to docs/benchmarks/results/overhead.md (section
`bench:overhead`).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.harness import (
    _f,
    _mib,
    _x,
    batchrun_cmd,
    child_command,
    md_table,
    measured_lines,
    print_table,
    run_cmd,
    write_completion_requests,
    write_results,
)

# -- part B: overhead ----------------------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
    """This benchmark's options."""
    p.add_argument("--overhead-requests", type=int, default=None, help="requests (1,000,000)")
    p.add_argument("--quick", action="store_true", help="20,000 requests")
    p.add_argument(
        "--floor-runs",
        type=int,
        default=3,
        help="runs of the floor (median taken), spread between the phases (3)",
    )


def child_floor(inp: Path, out: Path) -> None:
    """The floor of any Python tool on the overhead input: per line, read, `json.loads`, build the
    OpenAI batch output record batchrun writes for it, `json.dumps`, write. Nothing else: no
    validation, no journal, no worker, no fsync. Prints the loop's own wall time (FLOOR_LINE),
    which the benchmark takes as the floor's.

    The record has the shape and the sizes of a line of batchrun's output.jsonl for an echo
    completion: `{"id": "batch_req_<32 hex>", "custom_id", "response": {"status_code": 200,
    "request_id": <32 hex>, "body": <a Completion echoing the prompt>}, "error": null}`. Its ids
    come from a counter (no hashing), and it is encoded as batchrun encodes its output (one
    encoder built once: compact separators, UTF-8 as is).
    """
    encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
    loads = json.loads
    started = time.monotonic()
    created = int(time.time())
    with inp.open("rb", buffering=1 << 20) as f, out.open("wb", buffering=1 << 20) as o:
        for i, raw in enumerate(f):
            request = loads(raw)
            body = request["body"]
            prompt = body["prompt"]
            words = len(prompt.split())
            h = f"{i:032x}"
            record = {
                "id": "batch_req_" + h,
                "custom_id": request["custom_id"],
                "response": {
                    "status_code": 200,
                    "request_id": h,
                    "body": {
                        "id": "cmpl-" + h,
                        "object": "text_completion",
                        "created": created,
                        "model": body.get("model"),
                        "choices": [
                            {"index": 0, "text": prompt, "logprobs": None, "finish_reason": "stop"}
                        ],
                        "usage": {
                            "prompt_tokens": words,
                            "completion_tokens": words,
                            "total_tokens": 2 * words,
                        },
                    },
                },
                "error": None,
            }
            o.write(encode(record).encode("utf-8") + b"\n")
    print(f"{FLOOR_LINE} {time.monotonic() - started:.4f} s", flush=True)


# What the floor's child prints: its loop's wall time, the floor the ratios divide by.
FLOOR_LINE = "floor loop:"


def record_shape(value: Any) -> Any:
    """A JSON value's structure: objects as {key: shape}, lists by their first item, else the type."""
    if isinstance(value, dict):
        return {k: record_shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [record_shape(value[0])] if value else []
    return type(value).__name__


def first_line_shape(path: Path) -> Any:
    """The structure of the first JSON line of `path`, or None when there is none."""
    try:
        with path.open("rb") as f:
            return record_shape(json.loads(f.readline()))
    except (OSError, ValueError):
        return None


@dataclass
class Phase:
    """One timed command: a batchrun phase (wall_s: the whole process), or a run of the floor
    (wall_s: its loop, timed inside it; process_s: the whole process)."""

    name: str
    wall_s: float
    cpu_s: float | None
    load: float
    max_rss_kb: int | None
    tree_peak_rss_kb: int | None
    rc: int
    process_s: float | None = None

    @property
    def peak_rss_kb(self) -> int | None:
        return self.tree_peak_rss_kb or self.max_rss_kb


@dataclass
class Overhead:
    """Part B's measurements: batchrun's phases, the floor's runs, and facts about the files."""

    phases: list[Phase]
    floors: list[Phase]
    gen_s: float
    input_bytes: int
    sizes: dict[str, int]
    shape_matches: bool | None  # the floor's record has the structure of output.jsonl's lines

    @property
    def floor_s(self) -> float | None:
        """The floor's wall time: the median of its runs that succeeded."""
        walls = [p.wall_s for p in self.floors if p.rc == 0]
        return statistics.median(walls) if walls else None


def run_overhead(n: int, work: Path, floor_runs: int = 3) -> Overhead:
    """Time submit, export and export --parquet of `n` echo requests, and the floor on the same
    input: `floor_runs` runs spread between the phases (before submit, after the JSONL export,
    after the Parquet export, then alternating), so that drift in the machine's load hits both."""
    inp = work / "overhead-requests.jsonl"
    t = time.monotonic()
    write_completion_requests(inp, n)
    gen_s = time.monotonic() - t
    print(f"  generated {n:,} requests in {gen_s:.1f} s ({inp.stat().st_size / 2**20:,.0f} MiB)")
    job = work / "job-overhead"
    shutil.rmtree(job, ignore_errors=True)  # an earlier run's, with --work-dir
    floor_out = work / "floor-output.jsonl"
    phases: list[Phase] = []
    floors: list[Phase] = []
    cmds = [
        (
            "submit",
            [
                "submit",
                str(inp),
                "--job-dir",
                str(job),
                "--engine",
                "echo",
                "--batch-size",
                "1024",
                "--no-progress",
            ],
        ),
        ("export (JSONL)", ["export", "--job-dir", str(job)]),
        ("export --parquet", ["export", "--job-dir", str(job), "--parquet"]),
    ]

    def measure(
        name: str, argv: list[str], log: Path, into: list[Phase], *, loop: bool = False
    ) -> Phase:
        run = run_cmd(argv, log, measure_memory=True)
        wall, process_s, rc = run.wall_s, None, run.rc
        if loop:  # the floor: its loop's own time, as it printed it
            found = run.first(re.escape(FLOOR_LINE) + r" ([\d.]+) s")
            wall, process_s = (float(found[1][1]), run.wall_s) if found else (run.wall_s, None)
            rc = rc if found else (rc or 1)
        phase = Phase(
            name, wall, run.cpu_s, run.load, run.max_rss_kb, run.tree_peak_rss_kb, rc, process_s
        )
        into.append(phase)
        what = "whole process" if process_s is None else f"loop; process {process_s:.2f} s"
        print(
            f"  {name:18s} {wall:8.2f} s  {n / wall:10,.0f} req/s  ({what})  "
            f"peak RSS {_mib(phase.peak_rss_kb)}  load {run.load:.2f}  (exit {run.rc})",
            flush=True,
        )
        if run.rc != 0:
            print(run.tail(10))
        return phase

    def floor() -> None:
        k = len(floors) + 1
        argv = child_command(__name__, input=inp, result=floor_out)
        measure(f"floor (run {k})", argv, work / f"overhead-floor-{k}.log", floors, loop=True)

    # Where the floor's runs go: before submit, after export (JSONL), after export --parquet.
    slots = [0, 2, 3]
    slots += [1, 3] * max(0, floor_runs - len(slots))
    slots = sorted(slots[:floor_runs])
    for i, (name, args) in enumerate(cmds):
        for _ in range(slots.count(i)):
            floor()
        phase = measure(name, [*batchrun_cmd(), *args], work / f"overhead-{i}.log", phases)
        if phase.rc != 0:
            break
    for _ in range(slots.count(len(cmds))):
        floor()
    sizes = {
        p.name: p.stat().st_size
        for p in (job / "journal.jsonl", job / "output.jsonl", job / "results.parquet", floor_out)
        if p.exists()
    }
    ours, theirs = first_line_shape(floor_out), first_line_shape(job / "output.jsonl")
    shape = None if ours is None or theirs is None else ours == theirs
    if shape is False:
        print(f"  NOTE: the floor's record shape {ours} differs from output.jsonl's {theirs}")
    return Overhead(phases, floors, gen_s, inp.stat().st_size, sizes, shape)


# The targets: submit + export (JSONL) within this many times the floor's wall time, and the peak
# RSS of every phase's process tree under this many KiB (at 1M requests).
FLOOR_RATIO_TARGET = 3.0
RSS_TARGET_KB = 512 * 1024


def part_b(args: argparse.Namespace, work: Path, command: str, machine: dict[str, str]) -> bool:
    n = args.overhead_requests or (20_000 if args.quick else 1_000_000)
    print(f"Part B: batchrun overhead with the echo engine, {n:,} completion requests")
    o = run_overhead(n, work, args.floor_runs)
    phases = o.phases
    floor_s = o.floor_s
    complete = len(phases) == 3 and all(p.rc == 0 for p in phases)
    to_export = sum(p.wall_s for p in phases[:2]) if len(phases) >= 2 else None
    total = sum(p.wall_s for p in phases) if complete else None

    def ratio(wall: float | None) -> float | None:
        return wall / floor_s if wall is not None and floor_s else None

    def rate(wall: float | None) -> str:
        return f"{n / wall:,.0f}" if wall else "n/a"

    to_export_ratio = ratio(to_export)
    ok_phases = [p for p in phases if p.rc == 0]
    peak = max((p.peak_rss_kb or 0 for p in ok_phases), default=0) or None
    ratio_ok = (
        len(phases) >= 2
        and all(p.rc == 0 for p in phases[:2])
        and to_export_ratio is not None
        and to_export_ratio <= FLOOR_RATIO_TARGET
    )
    rss_ok = complete and peak is not None and peak < RSS_TARGET_KB
    head = [
        "phase",
        "wall (s)",
        "requests/s",
        "ratio to the floor",
        "CPU time (s)",
        "load avg",
        "peak RSS, process tree",
        "peak RSS, largest process",
    ]
    floor_walls = ", ".join(f"{p.wall_s:.2f}" for p in o.floors if p.rc == 0)
    floor_processes = ", ".join(
        f"{p.process_s:.2f}" for p in o.floors if p.rc == 0 and p.process_s is not None
    )
    floor_rss = max((p.peak_rss_kb or 0 for p in o.floors), default=0) or None
    floor_failed = [p for p in o.floors if p.rc != 0]
    rows = [
        [
            f"floor, its loop (median of {floor_walls} s; whole processes {floor_processes} s)"
            + (f" ({len(floor_failed)} run(s) FAILED)" if floor_failed else ""),
            _f(floor_s, "{:,.2f}"),
            rate(floor_s),
            "1.00x" if floor_s else "n/a",
            _f(statistics.median([p.cpu_s or 0.0 for p in o.floors]) if o.floors else None),
            _f(statistics.median([p.load for p in o.floors]) if o.floors else None, "{:.2f}"),
            _mib(floor_rss),
            _mib(max((p.max_rss_kb or 0 for p in o.floors), default=0) or None),
        ]
    ]
    rows += [
        [
            p.name + ("" if p.rc == 0 else f" (FAILED, exit {p.rc})"),
            _f(p.wall_s, "{:,.2f}"),
            rate(p.wall_s),
            _x(ratio(p.wall_s)),
            _f(p.cpu_s),
            _f(p.load, "{:.2f}"),
            _mib(p.tree_peak_rss_kb),
            _mib(p.max_rss_kb),
        ]
        for p in phases
    ]
    cpu_export = sum(p.cpu_s or 0.0 for p in phases[:2])
    cpu_all = sum(p.cpu_s or 0.0 for p in phases)
    if to_export is not None:
        rows.append(
            [
                "submit + export (JSONL)",
                _f(to_export, "{:,.2f}"),
                rate(to_export),
                _x(to_export_ratio),
                _f(cpu_export),
                "",
                "",
                "",
            ]
        )
    if total is not None:
        rows.append(
            [
                "submit + both exports",
                _f(total, "{:,.2f}"),
                rate(total),
                _x(ratio(total)),
                _f(cpu_all),
                "",
                "",
                "",
            ]
        )
    print()
    print_table(head, rows)
    at = "" if n == 1_000_000 else f"; the target is set at 1,000,000 requests, this run has {n:,}"
    verdict = [
        f"submit + export (JSONL): {_x(to_export_ratio)} the floor's wall time, "
        f"{rate(to_export)} requests/s (target <= {FLOOR_RATIO_TARGET:.0f}x: "
        f"{'met' if ratio_ok else 'MISSED'})",
        f"peak RSS, the largest process tree of submit, export and export --parquet: "
        f"{_mib(peak)} (target < {RSS_TARGET_KB // 1024} MiB: {'met' if rss_ok else 'MISSED'}"
        f"{at})",
    ]
    if o.shape_matches is False:
        verdict.append(
            "the floor's output record does NOT have the structure of output.jsonl's lines"
        )
    for v in verdict:
        print("  " + v)
    print()
    if args.no_docs:
        return ratio_ok and rss_ok
    sizes = ", ".join(f"{k} {v / 2**20:,.0f} MiB" for k, v in o.sizes.items())
    shape = {
        True: "checked by this run: the same keys and value types as the first line of "
        "output.jsonl",
        False: "this run found its structure DIFFERENT from output.jsonl's lines",
        None: "not checked (no output.jsonl)",
    }[o.shape_matches]
    verdict_lines = "\n".join(f"- {v}." for v in verdict)
    body = f"""## batchrun's own overhead (echo engine, no model)
{"" if not args.quick else chr(10) + "**Quick run (--quick): small sample, for development only.**" + chr(10)}
{measured_lines(machine, command)}
- Workload: {n:,} short `/v1/completions` requests ({o.input_bytes / 2**20:,.0f} MiB of
  input, generated in {o.gen_s:.1f} s, not counted) through
  `batchrun submit --engine echo --batch-size 1024 --no-progress`, then `batchrun export` and
  `batchrun export --parquet`. Output sizes: {sizes}.
- The floor: the least any Python tool does to turn this file into OpenAI batch output, in a
  process of its own on the same input file (`child_floor`): per line, read
  it, `json.loads`, build the output record batchrun writes for it (`id`, `custom_id`,
  `response: {{status_code, request_id, body: a Completion echoing the prompt}}`, `error: null`;
  {shape}), `json.dumps` (one compact encoder, as batchrun's export uses), write it to a file.
  No validation, no journal, no worker process, no fsync. Its wall time is its loop's, timed
  inside its process from opening the input to closing the output (the interpreter's start and
  imports not counted; the whole process's time is given beside it), the median of
  {len(o.floors)} runs spread over the same run (before submit, between the two exports, after
  the last), so that the machine's drift hits the floor and batchrun alike.
- batchrun's phases are timed as a user times them: each command a whole process, from launch
  to exit (the interpreter's start, imports, validation, the worker's start and shutdown, the
  summary printed). *Ratio to the floor*: a phase's wall time over the floor's.
- Peak RSS, process tree: the largest sum of the resident memory of the command and all its
  descendants (the journal-owning parent and its worker), polled every 50 ms with psutil.
  Largest process: `/usr/bin/time -v`'s maximum resident set size, the peak of the single largest
  process of the tree.
- CPU time: user + system CPU seconds of the command and its children (the worker included);
  above the wall time when the parent and the worker ran on both cores at once. Load avg: the
  1-minute load average when the phase started (above about 1: other work shared the 2 cores).

{md_table(head, rows)}

{verdict_lines}
"""
    write_results(__name__, "overhead", body)
    return ratio_ok and rss_ok


def child(args: argparse.Namespace) -> None:
    """The floor's child process."""
    child_floor(Path(args.input), Path(args.result))


def run(args: argparse.Namespace, work: Path, command: str, machine: dict[str, str]) -> None:
    """Part B."""
    part_b(args, work, command, machine)
