"""The benchmarks, one module each (scripts/bench_*.py, sharing scripts/bench_harness.py), run
alone with --help, and scripts/bench.py still runs them with the flags it always took."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support.cli import run_python as run
from support.fakes.openai_server import fake_openai_server
from support.paths import SCRIPTS


@pytest.mark.parametrize(
    "script",
    [
        "bench",
        "bench_vllm",
        "bench_overhead",
        "bench_dispatch",
        "bench_lora",
        "bench_models",
        "bench_embeddings",
        "bench_parent",
        "bench_pooling",
        "bench_remote",
        "bench_import",
    ],
)
def test_each_benchmark_runs_alone_with_help(script: str) -> None:
    r = run(str(SCRIPTS / f"{script}.py"), "--help")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"usage: {script}.py")
    assert "--work-dir" in r.stdout and "--no-docs" in r.stdout


@pytest.mark.slow
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


@pytest.mark.slow
def test_the_embeddings_benchmark_runs_small(tmp_path: Path) -> None:
    """bench_embeddings.py on 300 requests of 1,024 dimensions and their chat twin: every phase
    of both jobs is in the table and exited 0, and both targets' lines are printed (the
    journal's bytes a result do not depend on the count: that target holds at any size)."""
    r = run(
        str(SCRIPTS / "bench_embeddings.py"),
        "--requests", "300", "--no-docs", "--work-dir", str(tmp_path),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr + r.stdout
    for job in ("embeddings", "chat"):
        for phase in ("submit", "export", "export --parquet"):
            row = re.compile(rf"^\s*1\s+{job}\s+{phase}\s+[\d.]+\s", re.MULTILINE)
            assert row.search(r.stdout), (job, phase, r.stdout)
    journal = re.search(r"embeddings journal: ([\d,]+) bytes a result for 4,096 bytes", r.stdout)
    assert journal is not None, r.stdout
    assert int(journal.group(1).replace(",", "")) <= 1.5 * 4096
    assert "; target at most 1.5x): met" in r.stdout
    assert "embeddings submit requests/s over chat's, by round: " in r.stdout


@pytest.mark.slow
def test_the_parent_benchmark_runs_small(tmp_path: Path) -> None:
    """bench_parent.py on 300 requests of each kind, 2 workers: both submits exited 0, the
    parent's CPU per request and the job directory's size against float32 are printed."""
    r = run(
        str(SCRIPTS / "bench_parent.py"),
        "--requests", "300", "--no-docs", "--work-dir", str(tmp_path),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr + r.stdout
    for job in ("embeddings", "chat"):
        assert re.search(rf"^\s*{job}\s+[\d.]+\s", r.stdout, re.MULTILINE), r.stdout
    per = re.search(r"parent CPU per request: embeddings ([\d.]+) us, chat ([\d.]+) us", r.stdout)
    assert per is not None and float(per.group(1)) > 0 and float(per.group(2)) > 0, r.stdout
    size = re.search(r"embeddings job directory: ([\d.]+)x", r.stdout)
    assert size is not None and float(size.group(1)) > 1.0, r.stdout


@pytest.mark.slow
def test_the_lora_benchmark_runs_dry_through_bench_py(tmp_path: Path) -> None:
    """bench.py --lora --lora-echo: 4 adapters made, every line answered by batchrun (echo)."""
    r = run(
        str(SCRIPTS / "bench.py"), "--lora", "--lora-echo", "--lora-lines", "24", "--rounds", "1",
        "--no-docs", "--work-dir", str(tmp_path),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr + r.stdout
    assert "24 lines over 4 adapters (rank 8), max_tokens 16, dtype auto, max_loras 5" in r.stdout
    assert "echo engine: batchrun answered 24 of 24 lines" in r.stdout
    assert sorted(p.name for p in (tmp_path / "adapters").iterdir()) == [
        f"adapter{i}" for i in range(1, 5)
    ]


@pytest.mark.slow
def test_the_two_models_benchmark_runs_dry_on_its_own(tmp_path: Path) -> None:
    """bench_models.py --models-echo: the one job starts an engine per model, the two jobs one
    each, every line answered in both, and the ratio line is printed."""
    r = run(
        str(SCRIPTS / "bench_models.py"), "--models-echo", "--models-lines", "24", "--rounds", "1",
        "--no-docs", "--work-dir", str(tmp_path),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr + r.stdout
    # contender, round, wall, generation, answered, tokens, engine starts, load avg
    rows = {
        m.group(1): (m.group(2), m.group(3))
        for m in re.finditer(
            r"^  (one job, two models|two jobs, one model each) +1 +\S+ +\S+ +(\d+) +\S+ +(\d+) ",
            r.stdout,
            re.M,
        )
    }
    assert rows == {"one job, two models": ("24", "2"), "two jobs, one model each": ("24", "2")}
    assert "one job / two jobs, wall time: " in r.stdout


@pytest.mark.slow
def test_the_remote_benchmark_runs_small_against_a_fake_server(tmp_path: Path) -> None:
    """bench_remote.py on 20 lines against the fake OpenAI server: every contender answered
    every line, and the table gives batchrun's ratio to the best fixed concurrency."""
    with fake_openai_server(delay_s=0.01) as server:
        r = run(
            str(SCRIPTS / "bench_remote.py"), "--base-url", server.url, "--requests", "20",
            "--concurrency", "4,8", "--no-docs", "--work-dir", str(tmp_path),
        )  # fmt: skip
    assert r.returncode == 0, r.stderr
    rows = [line.split() for line in r.stdout.splitlines() if line.startswith("  fixed-")]
    assert [row[0] for row in rows] == ["fixed-4", "fixed-8"]
    assert all(row[4] == "20" for row in rows)
    [ours] = [line for line in r.stdout.splitlines() if line.startswith("  batchrun (window ")]
    assert ours.split()[-2] == "20" and ours.split()[-1].endswith("x")
