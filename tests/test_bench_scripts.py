"""The benchmarks, a registry (scripts/bench/: one module each, sharing scripts/bench/harness.py):
`scripts/bench.py --list` shows every one, and `scripts/bench.py NAME` runs each."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from bench import BENCHMARKS
from support.cli import run_python as run
from support.fakes.openai_server import fake_openai_server
from support.paths import ROOT, SCRIPTS

BENCH = str(SCRIPTS / "bench.py")
NOT_WRITING_RESULTS = {"images", "serve"}


def test_the_list_shows_every_benchmark_module_with_its_line() -> None:
    """Every module of scripts/bench/ but the harness is in the registry, and --list shows each
    name with its docstring's first line."""
    modules = {p.stem for p in (SCRIPTS / "bench").glob("*.py")} - {"__init__", "harness"}
    assert set(BENCHMARKS.values()) == modules
    r = run(BENCH, "--list")
    assert r.returncode == 0, r.stderr
    listed = dict(line.split(maxsplit=1) for line in r.stdout.splitlines() if line.startswith("  "))
    assert list(listed) == list(BENCHMARKS)
    assert all(len(text) > 20 and "\n" not in text for text in listed.values()), listed
    unknown = run(BENCH, "nosuch")
    assert unknown.returncode == 2 and "no benchmark called 'nosuch'" in unknown.stderr


@pytest.mark.parametrize("name", list(BENCHMARKS))
def test_each_benchmark_runs_with_help(name: str) -> None:
    r = run(BENCH, name, "--help")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"usage: bench.py {name}")
    assert "--work-dir" in r.stdout
    assert ("--no-docs" in r.stdout) == (name not in NOT_WRITING_RESULTS)


def test_results_go_to_the_benchmarks_own_file_one_section_a_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run replaces its section of docs/benchmarks/results/NAME.md and keeps the others."""
    from bench import harness

    monkeypatch.setattr(harness, "RESULTS", tmp_path)
    harness.write_results("bench.imports", "import", "## A\n\nfirst run")
    harness.write_results("bench.imports", "other", "## B\n\nkept")
    harness.write_results("bench.imports", "import", "## A\n\nsecond run")
    text = (tmp_path / "import.md").read_text(encoding="utf-8")
    assert text.startswith("# Benchmark results: import\n")
    assert "second run" in text and "first run" not in text and "kept" in text
    assert text.index("<!-- bench:import -->") < text.index("<!-- bench:other -->")


def test_the_notes_hold_no_generated_section_and_link_every_results_file() -> None:
    """docs/benchmarks.md is written by hand; what the benchmarks write is apart, each file named
    for a benchmark and linked from the notes."""
    notes = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    assert "<!-- bench:" not in notes
    results = sorted((ROOT / "docs" / "benchmarks" / "results").glob("*.md"))
    assert results
    for path in results:
        assert path.stem in BENCHMARKS, path
        assert f"](benchmarks/results/{path.name}#" in notes, path


@pytest.mark.slow
def test_the_overhead_benchmark_runs_small(tmp_path: Path) -> None:
    """A tiny run of part B (echo engine, no model): the phases all exit 0, and the floor ran in
    its child process."""
    r = run(
        BENCH, "overhead", "--overhead-requests", "300", "--floor-runs", "1", "--no-docs",
        "--work-dir", str(tmp_path),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr + r.stdout
    phases = [line for line in r.stdout.splitlines() if "(exit " in line]
    assert len(phases) == 4 and all("(exit 0)" in line for line in phases), r.stdout


@pytest.mark.slow
def test_the_embeddings_benchmark_runs_small(tmp_path: Path) -> None:
    """bench.py embeddings on 300 requests of 1,024 dimensions and their chat twin: every phase
    of both jobs is in the table and exited 0, and both targets' lines are printed (the
    journal's bytes a result do not depend on the count: that target holds at any size)."""
    r = run(
        BENCH, "embeddings", "--requests", "300", "--no-docs", "--work-dir", str(tmp_path),
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
    """bench.py parent on 300 requests of each kind, 2 workers: both submits exited 0, the
    parent's CPU per request, where it goes, and the job directory's size against float32 are
    printed."""
    r = run(
        BENCH, "parent", "--requests", "300", "--no-docs", "--work-dir", str(tmp_path),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr + r.stdout
    for job in ("embeddings", "chat"):
        assert re.search(rf"^\s*{job}\s+[\d.]+\s", r.stdout, re.MULTILINE), r.stdout
    per = re.search(r"parent CPU per request: embeddings ([\d.]+) us, chat ([\d.]+) us", r.stdout)
    assert per is not None and float(per.group(1)) > 0 and float(per.group(2)) > 0, r.stdout
    size = re.search(r"embeddings job directory: ([\d.]+)x", r.stdout)
    assert size is not None and float(size.group(1)) > 1.0, r.stdout
    # Where the parent's CPU goes: the validation column of each job's row of that table.
    parts = r.stdout[r.stdout.index("validation us") :]
    for job in ("embeddings", "chat"):
        row = re.search(rf"^\s*{job}\s+([-\d.]+)\s+([-\d.]+)\s+([\d.]+)\s", parts, re.MULTILINE)
        assert row is not None and float(row.group(3)) > 0, parts


@pytest.mark.slow
def test_the_lora_benchmark_runs_dry(tmp_path: Path) -> None:
    """bench.py lora --lora-echo: 4 adapters made, every line answered by batchrun (echo)."""
    r = run(
        BENCH,
        "lora",
        "--lora-echo",
        "--lora-lines",
        "24",
        "--rounds",
        "1",
        "--no-docs",
        "--work-dir",
        str(tmp_path),
    )
    assert r.returncode == 0, r.stderr + r.stdout
    assert "24 lines over 4 adapters (rank 8), max_tokens 16, dtype auto, max_loras 5" in r.stdout
    assert "echo engine: batchrun answered 24 of 24 lines" in r.stdout
    assert sorted(p.name for p in (tmp_path / "adapters").iterdir()) == [
        f"adapter{i}" for i in range(1, 5)
    ]


@pytest.mark.slow
def test_the_two_models_benchmark_runs_dry(tmp_path: Path) -> None:
    """bench.py models --models-echo: the one job starts an engine per model, the two jobs one
    each, every line answered in both, and the ratio line is printed."""
    r = run(
        BENCH,
        "models",
        "--models-echo",
        "--models-lines",
        "24",
        "--rounds",
        "1",
        "--no-docs",
        "--work-dir",
        str(tmp_path),
    )
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
    """bench.py remote on 20 lines against the fake OpenAI server: every contender answered
    every line, and the table gives batchrun's ratio to the best fixed concurrency."""
    with fake_openai_server(delay_s=0.01) as server:
        r = run(
            BENCH, "remote", "--base-url", server.url, "--requests", "20",
            "--concurrency", "4,8", "--no-docs", "--work-dir", str(tmp_path),
        )  # fmt: skip
    assert r.returncode == 0, r.stderr
    rows = [line.split() for line in r.stdout.splitlines() if line.startswith("  fixed-")]
    assert [row[0] for row in rows] == ["fixed-4", "fixed-8"]
    assert all(row[4] == "20" for row in rows)
    [ours] = [line for line in r.stdout.splitlines() if line.startswith("  batchrun (window ")]
    assert ours.split()[-2] == "20" and ours.split()[-1].endswith("x")
