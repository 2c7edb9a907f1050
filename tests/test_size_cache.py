"""The batch-size cache and the size a job records, across an out-of-memory back-off."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.cli import cli
from support.jobs import status_json, submit_echo
from support.lines import chat_input, write_jsonl

pytestmark = pytest.mark.slow  # out of the fast tier: docs/development.md


def _an_earlier_job_found_256(tmp_path: Path, isolated_cache: Path) -> Path:
    """An earlier job on this set-up found 256 (its probe ran 512 requests: a real measurement);
    the size cache's file."""
    first = submit_echo(
        chat_input(tmp_path / "a.jsonl", 600, "m"), tmp_path / "a", "--min-batch-size", "256"
    )
    assert first.returncode == 0, first.stderr
    cache = isolated_cache / "batch_sizes.json"
    assert list(json.loads(cache.read_text()).values()) == [256]
    return cache


def test_a_back_off_lowers_the_cached_size_and_the_job_records_the_size_running(
    tmp_path: Path, isolated_cache: Path
) -> None:
    cache = _an_earlier_job_found_256(tmp_path, isolated_cache)
    # The set-up now runs out of memory above 8: the job backs off from the cached 256 to 8.
    oom = {"BATCHRUN_ECHO_OOM_ABOVE": "8"}
    job = tmp_path / "b"
    second = submit_echo(chat_input(tmp_path / "b.jsonl", 100, "m"), job, env=oom)
    assert second.returncode == 0, second.stderr
    assert "batch size 256 (found by an earlier job on this set-up)" in second.stderr
    assert "backing off, batch size 16 -> 8" in second.stderr
    s = status_json(job)
    assert (s["batch_size"], s["batch_size_source"]) == (8, "out-of-memory back-off")
    assert list(json.loads(cache.read_text()).values()) == [8]
    # The next job starts at 8 and pays no restart.
    third = submit_echo(chat_input(tmp_path / "c.jsonl", 100, "m"), tmp_path / "c", env=oom)
    assert third.returncode == 0, third.stderr
    assert "batch size 8 (found by an earlier job on this set-up)" in third.stderr
    assert "out of memory" not in third.stderr


def test_a_job_with_its_own_kv_budget_keeps_its_sizes_apart(
    tmp_path: Path, isolated_cache: Path
) -> None:
    cache = _an_earlier_job_found_256(tmp_path, isolated_cache)
    before = json.loads(cache.read_text())
    # A small KV budget backs off to 4: the size jobs without one start from stays.
    small = submit_echo(
        chat_input(tmp_path / "b.jsonl", 50, "m"),
        tmp_path / "b",
        "--kv-cache-memory-bytes",
        "1000",
        "--batch-size",
        "16",
        env={"BATCHRUN_ECHO_OOM_ABOVE": "4"},
    )
    assert small.returncode == 0, small.stderr
    assert "backing off, batch size 8 -> 4" in small.stderr
    assert json.loads(cache.read_text()) == before
    third = submit_echo(chat_input(tmp_path / "c.jsonl", 50, "m"), tmp_path / "c")
    assert "batch size 256 (found by an earlier job on this set-up)" in third.stderr


def test_a_job_whose_lines_are_all_invalid_sizes_nothing_and_says_so(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "bad.jsonl", [{"custom_id": "x", "method": "GET"}, "{oops"])
    job = tmp_path / "job"
    r = submit_echo(src, job)
    assert r.returncode == 1, r.stderr
    assert "starting echo engine" not in r.stderr and "searching" not in r.stderr
    shown = cli("status", "--job-dir", str(job))
    assert shown.returncode == 0, shown.stderr
    assert "(no valid request)" in shown.stdout
    assert "none yet (nothing has run)" in shown.stdout
    assert "None" not in shown.stdout
