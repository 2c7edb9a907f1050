"""Benchmarks: batchrun against raw vLLM, vLLM's own batch runner and fixed chunks; and batchrun's
own overhead with the echo engine.

    .venv/bin/python scripts/bench.py                   # part A (200 requests), then part B (1M)
    .venv/bin/python scripts/bench.py --quick           # 40 requests, 20k overhead requests
    .venv/bin/python scripts/bench.py --skip-overhead   # part A only
    .venv/bin/python scripts/bench.py --overhead        # part B only
    .venv/bin/python scripts/bench.py --dispatch --rounds 2   # part C only (scripts/bench_dispatch.py)

Each part is a module of its own that also runs alone, with the same options (`--help`):
scripts/bench_vllm.py (part A), scripts/bench_overhead.py (part B), scripts/bench_dispatch.py
(part C); scripts/bench_harness.py is what they share. This script runs them with the flags it
always took.

Part A runs the same generated chat requests (seeded, varied prompts, max_tokens drawn from
8..128, temperature 0) through four contenders with the same engine settings, each in its own
process, one after another:

  (a) batchrun end to end: `batchrun submit` then `batchrun export`.
  (b) raw vLLM: one `LLM.chat(all_conversations, per_request_params)` call: the ceiling.
  (c) vLLM's batch runner: `python -m vllm.entrypoints.openai.run_batch`.
  (d) the naive recipe: fixed chunks of 32 through `LLM.chat`, one call per chunk.
  (e) raw vLLM in-process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), one `LLM.chat` call: on a CPU the
      model then gets every core, as batchrun's worker gives it; (b) keeps one for vLLM's
      engine-core process. (b) is what a user gets by default; (e) is the same process layout
      as batchrun's.

Wall time is the whole command (process start, imports, engine start, generation, shutdown; for
batchrun also validation and export). Generation time excludes process and engine start:

  (a) from the moment batchrun's parent prints "worker 0 ready" (time-stamped here as the line
      arrives) to the `time` of the last record in the job's journal: dispatching requests to the
      worker, tokenizing, generating, sending results back and journaling them.
  (b), (d), (e) the `LLM.chat` call(s) alone, timed inside the child process.
  (c) from the arrival of run_batch's "Reading batch from" log line (logged once the engine and
      the endpoints are up, before the file is parsed) to its "Writing outputs" line.

All four get the same dtype: by default the one batchrun's "auto" resolves to on this machine
(float32 on a CPU without AVX512-BF16/AMX, where vLLM's own "auto" keeps bf16 and falls back to
slow torch linear layers), passed explicitly; `--dtype auto` hands vLLM's "auto" to all instead.

Part B measures batchrun's own overhead with the echo engine (no model): submit, export and
export --parquet of a million short completion requests, with wall time and peak memory per phase,
against the floor of any Python tool on the same file, in a process of its own: per line, read,
`json.loads`, build the OpenAI batch output record, `json.dumps`, write (`child_floor`). Each
phase's wall time is also given as a ratio to the floor's (the median of `--floor-runs` runs,
spread between the phases); the targets: submit + export (JSONL) within 3x the floor, and every
phase's process tree under 512 MiB of peak RSS.

    .venv/bin/python scripts/bench.py --overhead --overhead-requests 200000 --no-docs

Results are printed and written to docs/benchmarks.md between the markers
`<!-- bench:vllm -->` / `<!-- bench:overhead -->` and their closing ones; the rest of that file is
kept as it is.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import bench_dispatch
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
        if not args.overhead:
            bench_vllm.part_a(args, work, command, machine)
        if args.overhead or not args.skip_overhead:
            bench_overhead.part_b(args, work, command, machine)

    run_benchmark(args.work_dir, the_command(__file__, argv), run)
    return 0


if __name__ == "__main__":
    sys.exit(main())
