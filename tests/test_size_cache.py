"""The batch-size cache and the size a job records, across an out-of-memory back-off."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.cli import cli
from support.lines import chat_line, write_jsonl

pytestmark = pytest.mark.slow  # out of the fast tier: docs/development.md


def make_input(tmp_path: Path, name: str, n: int) -> Path:
    return write_jsonl(tmp_path / name, [chat_line(f"r{i}", f"m {i}") for i in range(n)])


def status(job: Path) -> dict[str, object]:
    r = cli("status", "--job-dir", str(job), "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert isinstance(data, dict)
    return data


def test_a_back_off_lowers_the_cached_size_and_the_job_records_the_size_running(
    tmp_path: Path, isolated_cache: Path
) -> None:
    # An earlier job on this set-up found 256 (its probe ran 512 requests: a real measurement).
    first = cli(
        "submit", str(make_input(tmp_path, "a.jsonl", 600)), "--job-dir", str(tmp_path / "a"),
        "--engine", "echo", "--min-batch-size", "256", "--no-progress",
    )  # fmt: skip
    assert first.returncode == 0, first.stderr
    cache = isolated_cache / "batch_sizes.json"
    assert list(json.loads(cache.read_text()).values()) == [256]
    # The set-up now runs out of memory above 8: the job backs off from the cached 256 to 8.
    oom = {"BATCHRUN_ECHO_OOM_ABOVE": "8"}
    job = tmp_path / "b"
    second = cli(
        "submit", str(make_input(tmp_path, "b.jsonl", 100)), "--job-dir", str(job),
        "--engine", "echo", "--no-progress", env=oom,
    )  # fmt: skip
    assert second.returncode == 0, second.stderr
    assert "batch size 256 (found by an earlier job on this set-up)" in second.stderr
    assert "backing off, batch size 16 -> 8" in second.stderr
    s = status(job)
    assert (s["batch_size"], s["batch_size_source"]) == (8, "out-of-memory back-off")
    assert list(json.loads(cache.read_text()).values()) == [8]
    # The next job starts at 8 and pays no restart.
    third = cli(
        "submit", str(make_input(tmp_path, "c.jsonl", 100)), "--job-dir", str(tmp_path / "c"),
        "--engine", "echo", "--no-progress", env=oom,
    )  # fmt: skip
    assert third.returncode == 0, third.stderr
    assert "batch size 8 (found by an earlier job on this set-up)" in third.stderr
    assert "out of memory" not in third.stderr


def test_a_job_with_its_own_kv_budget_keeps_its_sizes_apart(
    tmp_path: Path, isolated_cache: Path
) -> None:
    base = ("--engine", "echo", "--no-progress")
    first = cli(
        "submit", str(make_input(tmp_path, "a.jsonl", 600)), "--job-dir", str(tmp_path / "a"),
        *base, "--min-batch-size", "256",
    )  # fmt: skip
    assert first.returncode == 0, first.stderr
    cache = isolated_cache / "batch_sizes.json"
    before = json.loads(cache.read_text())
    assert list(before.values()) == [256]
    # A small KV budget backs off to 4: the size jobs without one start from stays.
    small = cli(
        "submit", str(make_input(tmp_path, "b.jsonl", 50)), "--job-dir", str(tmp_path / "b"),
        *base, "--kv-cache-memory-bytes", "1000", "--batch-size", "16",
        env={"BATCHRUN_ECHO_OOM_ABOVE": "4"},
    )  # fmt: skip
    assert small.returncode == 0, small.stderr
    assert "backing off, batch size 8 -> 4" in small.stderr
    assert json.loads(cache.read_text()) == before
    third = cli(
        "submit", str(make_input(tmp_path, "c.jsonl", 50)), "--job-dir", str(tmp_path / "c"),
        *base,
    )  # fmt: skip
    assert "batch size 256 (found by an earlier job on this set-up)" in third.stderr


def test_a_job_whose_lines_are_all_invalid_sizes_nothing_and_says_so(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "bad.jsonl", [{"custom_id": "x", "method": "GET"}, "{oops"])
    job = tmp_path / "job"
    r = cli("submit", str(src), "--job-dir", str(job), "--engine", "echo", "--no-progress")
    assert r.returncode == 1, r.stderr
    assert "starting echo engine" not in r.stderr and "searching" not in r.stderr
    shown = cli("status", "--job-dir", str(job))
    assert shown.returncode == 0, shown.stderr
    assert "(no valid request)" in shown.stdout
    assert "none yet (nothing has run)" in shown.stdout
    assert "None" not in shown.stdout
