"""The remote engine against a real `vllm serve` (CPU, the embedded default model) started once
for these tests, with a fault-injecting proxy in front (tests/support/fakes/fault_proxy.py): answers
equal the server's own to the same bodies, kill -9 and resume answer every line exactly once,
and a job outlives the server being killed and started again."""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.cli import cli, start_cli
from support.fakes.fault_proxy import fault_proxy
from support.jobs import journal_records, rerun
from support.models import default_model_dir
from support.processes import kill_group
from support.vllm_remote import SERVED_NAME, VllmServe
from support.waits import results_at_least, wait_until

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

COLORS = ["red", "blue", "green", "yellow", "purple", "orange", "black", "white"]


@pytest.fixture(scope="session")
def vllm_serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServe]:
    """One `vllm serve` for the session (tests/support/vllm_remote.py)."""
    server = VllmServe(default_model_dir(), tmp_path_factory.mktemp("vllm-serve") / "log")
    server.start()
    try:
        yield server
    finally:
        server.kill()


def _line(cid: str, text: str, max_tokens: int) -> dict[str, Any]:
    return {
        "custom_id": cid,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {
            "messages": [{"role": "user", "content": text}],
            "max_tokens": max_tokens,
            "temperature": 0,
        },
    }


def _input(path: Path, n: int, max_tokens: int) -> tuple[Path, list[dict[str, Any]]]:
    lines = [
        _line(f"c{i}", f"Write one sentence about the color {COLORS[i % 8]} ({i}).", max_tokens)
        for i in range(n)
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path, lines


def _exactly_once(job: Path, n: int) -> dict[str, dict[str, Any]]:
    records = journal_records(job)
    counts = Counter(r["custom_id"] for r in records)
    assert len(counts) == n and set(counts.values()) == {1}, counts
    assert all(r["ok"] for r in records), [r for r in records if not r["ok"]][:2]
    return {r["custom_id"]: r for r in records}


def test_answers_equal_the_server_s_own_through_throttling_and_drops(
    vllm_serve: VllmServe, tmp_path: Path
) -> None:
    src, lines = _input(tmp_path / "in.jsonl", 8, 12)
    job = tmp_path / "job"
    with fault_proxy(vllm_serve.root) as proxy:
        proxy.faults.extend(["429:1", "drop", "503", "503", "503", "502"])
        r = cli("submit", str(src), "--job-dir", str(job), "--base-url", proxy.url, "--no-progress")
        assert r.returncode == 0, r.stderr
        assert proxy.thrown == ["429:1", "drop", "503", "503", "503", "502"]
        assert proxy.posts == 8 + 6
    records = _exactly_once(job, 8)
    for line in lines:
        direct = vllm_serve.post("/chat/completions", {**line["body"], "model": SERVED_NAME})
        got = records[line["custom_id"]]["body"]
        assert got["model"] == SERVED_NAME
        assert got["choices"] == direct["choices"], line["custom_id"]
        assert got["usage"] == direct["usage"]
    manifest = json.loads((job / "manifest.json").read_text())
    assert manifest["engine"]["base_url"] == proxy.url and manifest["model"] == SERVED_NAME
    r = cli("export", "--job-dir", str(job))
    assert r.returncode == 0, r.stderr
    assert len((job / "output.jsonl").read_text().splitlines()) == 8


def test_kill_9_then_resume_answers_every_line_exactly_once(
    vllm_serve: VllmServe, tmp_path: Path
) -> None:
    src, _ = _input(tmp_path / "in.jsonl", 24, 24)
    job = tmp_path / "job"
    with fault_proxy(vllm_serve.root) as proxy:
        proxy.faults.extend(["503", "drop"])
        proc = start_cli(
            "submit", str(src), "--job-dir", str(job), "--base-url", proxy.url, "--no-progress",
            "--max-concurrency", "4",
        )  # fmt: skip
        wait_until(results_at_least(job, 4), "4 lines are answered", timeout=300)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        assert len(journal_records(job)) < 24
        r = rerun("resume", job)  # no --base-url: the job's
        assert r.returncode == 0, r.stderr
    _exactly_once(job, 24)


def test_a_job_outlives_the_server_killed_and_started_again(
    vllm_serve: VllmServe, tmp_path: Path
) -> None:
    src, _ = _input(tmp_path / "in.jsonl", 16, 24)
    job = tmp_path / "job"
    proc = start_cli(
        "submit", str(src), "--job-dir", str(job), "--base-url", vllm_serve.url, "--no-progress",
        "--max-concurrency", "2",
    )  # fmt: skip
    try:
        wait_until(results_at_least(job, 3), "3 lines are answered", timeout=300)
        vllm_serve.kill()
        answered_before = len(journal_records(job))
        time.sleep(3)  # the job meets a closed port for a while
        vllm_serve.start()
        _, err = proc.communicate(timeout=600)
    finally:
        kill_group(proc)
    assert proc.returncode == 0, err
    assert answered_before < 16
    _exactly_once(job, 16)
    assert vllm_serve.starts == 2
