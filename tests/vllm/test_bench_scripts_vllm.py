"""The benchmarks that run the real vLLM engine (scripts/bench.py pooling, vllm --end-to-end), run
small: each runs to its end and prints its ratio and batchrun's timeline."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support.cli import run_python as run
from support.paths import SCRIPTS

BENCH = str(SCRIPTS / "bench.py")


@pytest.mark.vllm
def test_the_pooling_benchmark_runs_small_against_raw_vllm(tmp_path: Path) -> None:
    """bench.py pooling on 40 passages: batchrun (submit + export) and raw vLLM's LLM.embed
    each ran to exit 0 on the packaged embedding model, and the ratio line is printed."""
    r = run(
        BENCH, "pooling", "--passages", "40", "--rounds", "1", "--jobs", "embeddings", "--no-docs",
        "--work-dir", str(tmp_path),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr + r.stdout
    row = re.search(
        r"^\s*1\s+embeddings\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+([\d.]+)x\s", r.stdout, re.M
    )
    assert row is not None and float(row.group(1)) > 0, r.stdout
    assert (
        "embeddings: raw vLLM's time (import to its call's end) over batchrun submit's" in r.stdout
    )
    # batchrun's timeline, from its job's event log: the worker's start and the results.
    for moment in ("worker 0: vllm_imported", "parent: first_result", "parent: last_result"):
        assert moment in r.stdout, r.stdout


@pytest.mark.vllm
def test_the_end_to_end_benchmark_prints_the_ratio_and_the_timeline(tmp_path: Path) -> None:
    """bench.py vllm --end-to-end on 8 requests: batchrun submit and raw vLLM each ran, the
    ratio is printed, and batchrun's timeline runs from validation to the exit in order."""
    r = run(
        BENCH, "vllm", "--end-to-end", "--requests", "8", "--rounds", "1", "--no-docs",
        "--work-dir", str(tmp_path),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr + r.stdout
    found = re.search(r"over batchrun submit's \(launch to exit\): ([\d.]+)x", r.stdout)
    assert found is not None and float(found.group(1)) > 0, r.stdout
    order = [
        "parent: worker_spawn",
        "parent: validated",
        "worker 0: vllm_imported",
        "worker 0: engine_built",
        "parent: first_result",
        "parent: last_result",
        "parent: journal_closed",
        "parent: exit",
    ]
    at = [r.stdout.find(moment) for moment in order]
    assert -1 not in at and at == sorted(at), r.stdout
