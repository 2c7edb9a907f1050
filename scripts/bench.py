"""Benchmarks: batchrun against raw vLLM, vLLM's own batch runner and fixed chunks; and batchrun's
own overhead with the echo engine.

    .venv/bin/python scripts/bench.py                   # part A (200 requests), then part B (1M)
    .venv/bin/python scripts/bench.py --quick           # 40 requests, 20k overhead requests
    .venv/bin/python scripts/bench.py --skip-overhead   # part A only
    .venv/bin/python scripts/bench.py --overhead        # part B only
    .venv/bin/python scripts/bench.py --dispatch --rounds 2   # part C only (scripts/bench_dispatch.py)
    .venv/bin/python scripts/bench.py --lora --rounds 2       # LoRA adapters (scripts/bench_lora.py)
    .venv/bin/python scripts/bench.py --models --rounds 2     # two models (scripts/bench_models.py)

Each part is a module of its own that also runs alone, with the same options (`--help`):
scripts/bench_vllm.py (part A), scripts/bench_overhead.py (part B), scripts/bench_dispatch.py
(part C); scripts/bench_harness.py is what they share. This script runs them with the flags it
always took.

What each part runs and how it times it is in that part's own docstring.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import bench_dispatch
import bench_lora
import bench_models
import bench_overhead
import bench_vllm
from bench_harness import common_arguments, run_benchmark, the_command


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    bench_vllm.add_arguments(p)
    p.add_argument("--quick", action="store_true", help="40 requests and 20k overhead requests")
    p.add_argument("--overhead", action="store_true", help="run part B (the overhead) only")
    p.add_argument("--skip-overhead", action="store_true", help="run part A only")
    bench_overhead.add_arguments(p)
    p.add_argument(
        "--dispatch",
        action="store_true",
        help="run part C only: the dispatch plan on workloads (a)-(d) (scripts/bench_dispatch.py)",
    )
    bench_dispatch.add_arguments(p)
    p.add_argument(
        "--lora", action="store_true", help="run the LoRA benchmark only (scripts/bench_lora.py)"
    )
    bench_lora.add_arguments(p)
    p.add_argument(
        "--models",
        action="store_true",
        help="run the two-models benchmark only (scripts/bench_models.py)",
    )
    bench_models.add_arguments(p)
    common_arguments(p)
    # internal: one contender's child process
    bench_vllm.add_child_arguments(p)
    p.add_argument(
        "--_child-floor", dest="child_floor", action="store_true", help=argparse.SUPPRESS
    )
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child_llm:
        bench_vllm.child_llm(args)
        return 0
    if args.child_floor:
        bench_overhead.child_floor(Path(args.input), Path(args.result))
        return 0

    def run(work: Path, command: str, machine: dict[str, str]) -> None:
        if args.dispatch:
            bench_dispatch.part_c(args, work, command, machine)
            return
        if args.lora:
            bench_lora.part_lora(args, work, command, machine)
            return
        if args.models:
            bench_models.part_models(args, work, command, machine)
            return
        if not args.overhead:
            bench_vllm.part_a(args, work, command, machine)
        if args.overhead or not args.skip_overhead:
            bench_overhead.part_b(args, work, command, machine)

    run_benchmark(args.work_dir, the_command(__file__, argv), run)
    return 0


if __name__ == "__main__":
    sys.exit(main())
