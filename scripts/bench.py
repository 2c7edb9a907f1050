"""Runs one benchmark of scripts/bench/ by name.

    .venv/bin/python scripts/bench.py --list                 # every benchmark, one line each
    .venv/bin/python scripts/bench.py vllm --rounds 2        # one of them, with its options
    .venv/bin/python scripts/bench.py overhead --help        # its options

The benchmarks and how to add one: scripts/bench/__init__.py; what they share:
scripts/bench/harness.py; their results: docs/benchmarks/results/NAME.md.
"""

from __future__ import annotations

import sys

from bench.harness import main

if __name__ == "__main__":
    sys.exit(main())
