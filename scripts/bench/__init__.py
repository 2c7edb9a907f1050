"""The benchmarks, by name: `scripts/bench.py --list` shows them, `scripts/bench.py NAME` runs one.

A benchmark is a module of this package holding only its arguments and its run:

    '''One line: what it measures (what `--list` shows).

    How it measures, at length.
    '''

    def add_arguments(parser: argparse.ArgumentParser) -> None: ...
    def run(args: argparse.Namespace, work: Path, command: str, machine: dict[str, str]) -> None:
        ...  # harness.write_results(__name__, KEY, markdown) unless args.no_docs

and, where one of its contenders is a process of its own, `child(options: argparse.Namespace)`,
started with `harness.child_command(__name__, **options)`. `WRITES_RESULTS = False` in a module
that writes none (it then takes no --no-docs). What they share (the workload, running and timing
commands, rounds, ratios, tables, the machine, writing results) is harness.py, once.
"""

from __future__ import annotations

# name (what scripts/bench.py takes) -> module of this package
BENCHMARKS: dict[str, str] = {
    "vllm": "vllm",
    "overhead": "overhead",
    "dispatch": "dispatch",
    "lora": "lora",
    "models": "models",
    "images": "images",
    "embeddings": "embeddings",
    "parent": "parent",
    "pooling": "pooling",
    "remote": "remote",
    "scale": "scale",
    "metrics": "metrics",
    "serve": "serve",
    "import": "imports",
}
