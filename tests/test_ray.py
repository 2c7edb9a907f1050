"""Jobs on a Ray cluster (a local Ray instance here): same journal, same guarantees.

The actors ask for CPU resources only; the echo engine stands in where many workers or a killed
actor are needed, and one job runs the real vLLM engine in one actor.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import (
    chat_line,
    cli,
    group_alive,
    journal_records,
    read_jsonl,
    results_at_least,
    start_cli,
    wait_until,
    write_jsonl,
)

pytestmark = pytest.mark.ray


def make_input(tmp_path: Path, n: int) -> Path:
    return write_jsonl(
        tmp_path / "in.jsonl", [chat_line(f"r{i}", f"message {i}") for i in range(n)]
    )


def answers(job: Path) -> dict[str, Any]:
    return {
        o["custom_id"]: o["response"]["body"]["choices"][0]["message"]["content"]
        for o in read_jsonl(job / "output.jsonl")
    }


def actor_pids() -> list[int]:
    """Processes of batchrun's Ray actors (Ray names them after the actor class)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if cmdline.startswith(b"ray::EngineActor"):
                pids.append(int(entry.name))
    return pids


def test_ray_results_match_a_single_machine_run(tmp_path: Path) -> None:
    src = make_input(tmp_path, 300)
    local, on_ray = tmp_path / "local", tmp_path / "ray"
    env = {"BATCHRUN_ECHO_DELAY_MS": "5"}
    common = ("--engine", "echo", "--batch-size", "16", "--no-progress")
    assert cli("submit", str(src), "--job-dir", str(local), *common, env=env).returncode == 0
    r = cli(
        "submit",
        str(src),
        "--job-dir",
        str(on_ray),
        *common,
        "--ray",
        "local",
        "--workers",
        "3",
        env=env,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    for i in range(3):
        assert f"ray worker {i}" in r.stderr
    for job in (local, on_ray):
        assert cli("export", "--job-dir", str(job)).returncode == 0
    assert answers(on_ray) == answers(local)
    assert len(answers(local)) == 300
    status = json.loads(cli("status", "--job-dir", str(on_ray), "--json").stdout)
    workers = status["workers"]
    # Every actor that got work is listed; on a loaded machine the first actor up may take it all.
    assert workers and all(w["kind"] == "ray" and w["node"] for w in workers)
    assert sum(w["requests"] for w in workers) == 300


def test_a_killed_actor_is_replaced_and_nothing_is_lost(tmp_path: Path) -> None:
    src = make_input(tmp_path, 600)
    job = tmp_path / "job"
    p = start_cli(
        "submit",
        str(src),
        "--job-dir",
        str(job),
        "--engine",
        "echo",
        "--batch-size",
        "8",
        "--ray",
        "local",
        "--workers",
        "2",
        "--no-progress",
        env={"BATCHRUN_ECHO_DELAY_MS": "40"},
    )
    try:
        wait_until(results_at_least(job, 50), "the job has 50 results")
        pids = actor_pids()
        assert len(pids) == 2
        os.kill(pids[0], signal.SIGKILL)
        _, stderr = p.communicate(timeout=300)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 0, stderr[-3000:]
    assert "the Ray actor was lost" in stderr and "Running them again in halves" in stderr
    assert sorted(x["custom_id"] for x in journal_records(job)) == sorted(
        f"r{i}" for i in range(600)
    )


def test_a_job_started_on_ray_is_resumed_without_it(tmp_path: Path) -> None:
    src = make_input(tmp_path, 500)
    job = tmp_path / "job"
    p = start_cli(
        "submit",
        str(src),
        "--job-dir",
        str(job),
        "--engine",
        "echo",
        "--batch-size",
        "8",
        "--ray",
        "local",
        "--workers",
        "2",
        "--no-progress",
        env={"BATCHRUN_ECHO_DELAY_MS": "40"},
    )
    wait_until(results_at_least(job, 50), "the job has 50 results")
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    for pid in actor_pids():  # a killed driver's local Ray instance goes down with it
        os.kill(pid, signal.SIGKILL)
    done = len(journal_records(job))
    assert 50 <= done < 500
    r = cli("resume", "--job-dir", str(job), "--no-progress")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "ray worker" not in r.stderr
    assert sorted(x["custom_id"] for x in journal_records(job)) == sorted(
        f"r{i}" for i in range(500)
    )


@pytest.mark.parametrize("second_after", [None, 0.02])
def test_ctrl_c_on_ray_leaves_no_process_behind(tmp_path: Path, second_after: float | None) -> None:
    """One Ctrl-C shuts the local Ray instance down; a second one, which stops at once, must
    not leave Ray's daemons and agents running either."""
    src = make_input(tmp_path, 3000)
    job = tmp_path / "job"
    p = start_cli(
        "submit", str(src), "--job-dir", str(job), "--engine", "echo", "--batch-size", "8",
        "--ray", "local", "--workers", "2", "--no-progress",
        env={"BATCHRUN_ECHO_DELAY_MS": "50"},
    )  # fmt: skip
    wait_until(results_at_least(job, 50), "the job has 50 results")
    os.killpg(p.pid, signal.SIGINT)
    if second_after is not None:
        time.sleep(second_after)
        os.killpg(p.pid, signal.SIGINT)
    try:
        _, stderr = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert p.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr
    deadline = time.monotonic() + 10
    while (left := group_alive(p.pid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert left == [], "processes left running after the stop"
    r = cli("resume", "--job-dir", str(job), "--no-progress", env={"BATCHRUN_ECHO_DELAY_MS": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert sorted(x["custom_id"] for x in journal_records(job)) == sorted(
        f"r{i}" for i in range(3000)
    )


@pytest.mark.vllm
def test_the_real_vllm_engine_in_one_actor(tmp_path: Path) -> None:
    lines = [
        chat_line("math", "What is 1 plus 1? Answer briefly.", max_tokens=16, temperature=0),
        chat_line(
            "capital", "What is the capital of France? One word.", max_tokens=8, temperature=0
        ),
    ]
    src = write_jsonl(tmp_path / "in.jsonl", lines)
    job = tmp_path / "job"
    r = cli(
        "submit",
        str(src),
        "--job-dir",
        str(job),
        "--max-model-len",
        "512",
        "--batch-size",
        "4",
        "--ray",
        "local",
        "--workers",
        "1",
        "--no-progress",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "ray worker 0" in r.stderr
    assert cli("export", "--job-dir", str(job)).returncode == 0
    got = answers(job)
    assert "2" in got["math"] and "paris" in got["capital"].lower()
