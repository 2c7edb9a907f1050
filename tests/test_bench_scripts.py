"""The benchmarks, one module each (scripts/bench_*.py, sharing scripts/bench_harness.py), run
alone with --help, and scripts/bench.py still runs them with the flags it always took."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, cwd=ROOT, timeout=300
    )


@pytest.mark.parametrize("script", ["bench", "bench_vllm", "bench_overhead", "bench_dispatch"])
def test_each_benchmark_runs_alone_with_help(script: str) -> None:
    r = run(str(SCRIPTS / f"{script}.py"), "--help")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"usage: {script}.py")
    assert "--work-dir" in r.stdout and "--no-docs" in r.stdout


def test_the_overhead_benchmark_runs_on_its_own_and_through_bench_py(tmp_path: Path) -> None:
    """A tiny run of part B (echo engine, no model), both ways: the phases all exit 0."""
    for script, extra in (("bench_overhead.py", ()), ("bench.py", ("--overhead",))):
        r = run(
            str(SCRIPTS / script),
            *extra,
            "--overhead-requests",
            "300",
            "--floor-runs",
            "1",
            "--no-docs",
            "--work-dir",
            str(tmp_path / script),
        )
        assert r.returncode == 0, r.stderr + r.stdout
        phases = [line for line in r.stdout.splitlines() if "(exit " in line]
        assert len(phases) == 4 and all("(exit 0)" in line for line in phases), r.stdout
