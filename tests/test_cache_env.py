"""BATCHRUN_CACHE_DIR is --cache-dir's default; a job keeps its --cache-dir; BATCHRUN_HOME moves
batchrun's own cache (converted models, batch sizes)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support.jobs import journal_records, rerun, status_json, submit_echo
from support.lines import chat_line, write_jsonl

from batchrun.cache_home import cache_root

IDS = [f"r{i}" for i in range(6)]
ALL = ",".join(IDS)


def submit(src: Path, job: Path, *flags: str, **env: str) -> Any:
    return submit_echo(src, job, *flags, env=env)


def cached(job: Path) -> set[str]:
    """The custom_ids whose last record came from the answer cache."""
    last = {rec["custom_id"]: rec for rec in journal_records(job)}
    return {cid for cid, rec in last.items() if rec.get("cached") and rec["ok"]}


@pytest.fixture
def src(tmp_path: Path) -> Path:
    path = tmp_path / "in.jsonl"
    write_jsonl(path, [chat_line(cid, f"prompt {cid}", temperature=0) for cid in IDS])
    return path


def test_the_env_variable_turns_the_answer_cache_on(tmp_path: Path, src: Path) -> None:
    cache = tmp_path / "answers"
    r = submit(src, tmp_path / "j1", BATCHRUN_CACHE_DIR=str(cache))
    assert r.returncode == 0, r.stderr
    # Every request reaching the engine now fails: the second job's answers all come from the cache.
    second = tmp_path / "j2"
    r = submit(src, second, BATCHRUN_CACHE_DIR=str(cache), BATCHRUN_ECHO_FAIL=ALL)
    assert r.returncode == 0, r.stderr
    assert cached(second) == set(IDS)
    assert status_json(second)["cache_hits"] == len(IDS)


@pytest.mark.slow
def test_a_job_keeps_the_cache_dir_it_was_submitted_with(tmp_path: Path, src: Path) -> None:
    cache = tmp_path / "answers"
    job = tmp_path / "job"
    # Submitted with an empty cache and an engine failing every request: nothing answered.
    r = submit(src, job, "--cache-dir", str(cache), BATCHRUN_ECHO_FAIL=ALL)
    assert r.returncode == 1
    assert json.loads((job / "manifest.json").read_text())["cache_dir"] == str(cache.resolve())
    # Another job fills the cache.
    assert submit(src, tmp_path / "filler", "--cache-dir", str(cache)).returncode == 0
    # retry-failed without --cache-dir (and the engine still failing) answers from the job's.
    r = rerun("retry-failed", job, env={"BATCHRUN_ECHO_FAIL": ALL})
    assert r.returncode == 0, r.stderr
    assert cached(job) == set(IDS)


def test_the_env_variable_on_resume_of_a_job_without_a_cache(tmp_path: Path, src: Path) -> None:
    cache = tmp_path / "answers"
    job = tmp_path / "job"
    assert submit(src, job, BATCHRUN_ECHO_FAIL=ALL).returncode == 1
    assert json.loads((job / "manifest.json").read_text())["cache_dir"] is None
    assert submit(src, tmp_path / "filler", "--cache-dir", str(cache)).returncode == 0
    r = rerun(
        "retry-failed", job, env={"BATCHRUN_ECHO_FAIL": ALL, "BATCHRUN_CACHE_DIR": str(cache)}
    )
    assert r.returncode == 0, r.stderr
    assert cached(job) == set(IDS)


def test_a_saved_cache_dir_that_went_bad_runs_without_it(tmp_path: Path, src: Path) -> None:
    cache = tmp_path / "answers"
    job = tmp_path / "job"
    assert submit(src, job, "--cache-dir", str(cache), BATCHRUN_ECHO_FAIL=ALL).returncode == 1
    cache.rename(tmp_path / "gone")
    cache.write_text("not a directory now")
    r = rerun("retry-failed", job)
    assert r.returncode == 0, r.stderr
    assert (
        f"running without the job's answer cache: --cache-dir {cache.resolve()} cannot be used: "
        "Not a directory; give a directory you can write to"
    ) in r.stderr.splitlines()
    assert cached(job) == set()


def test_batchrun_home_moves_the_model_cache_and_cache_dir_does_not(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("BATCHRUN_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("BATCHRUN_CACHE_DIR", str(tmp_path / "answers"))
    assert cache_root() == tmp_path / "home"
    monkeypatch.delenv("BATCHRUN_HOME")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "batchrun"
