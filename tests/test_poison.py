"""Requests that crash the engine worker: isolated by the scheduler, failed alone, the job goes on.

Through the real CLI and real worker processes; the echo engine's BATCHRUN_ECHO_CRASH_ON kills the
worker (SIGKILL to itself) the moment it receives one of the listed requests, as a native crash
in a tokenizer or a sampler would. The real poison lines on the real engine are in
tests/vllm/test_vllm_e2e.py; the scheduler's decisions, in process, in tests/test_scheduler.py.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from pathlib import Path

import pytest
from support.cli import cli
from support.jobs import journal_records, rerun, submit_echo
from support.lines import chat_input, read_jsonl

pytestmark = pytest.mark.slow  # out of the fast tier: docs/development.md


@pytest.mark.parametrize("workers", [1, 2])
def test_poison_requests_fail_alone_and_every_other_request_is_answered(
    tmp_path: Path, workers: int
) -> None:
    src = chat_input(tmp_path / "in.jsonl", 60, max_tokens=4)
    job = tmp_path / "job"
    env = {"BATCHRUN_ECHO_CRASH_ON": "r7,r41", "BATCHRUN_ECHO_DELAY_MS": "2"}
    r = submit_echo(src, job, "--batch-size", "16", "--workers", str(workers), env=env)
    assert r.returncode == 1, r.stderr  # finished, with two failed requests
    assert "Traceback" not in r.stderr
    assert "error:" not in r.stderr
    # The cost is announced when the suspicion starts, and the verdict names the request.
    assert "Running them again in halves, each alone, to find the one that crashes it" in r.stderr
    assert "died running request 'r7' (line 8) on its own" in r.stderr
    assert "died running request 'r41' (line 42) on its own" in r.stderr
    # Exactly once per custom_id in the journal: no request answered twice, none lost.
    counts = Counter(rec["custom_id"] for rec in journal_records(job))
    assert counts == Counter({f"r{i}": 1 for i in range(60)})
    assert cli("export", "--job-dir", str(job)).returncode == 0
    assert len(read_jsonl(job / "output.jsonl")) == 58
    errors = read_jsonl(job / "errors.jsonl")
    assert [(e["custom_id"], e["error"]["line"], e["error"]["code"]) for e in errors] == [
        ("r7", 8, "engine_crash"),
        ("r41", 42, "engine_crash"),
    ]
    assert errors[0]["response"]["status_code"] == 500
    assert errors[0]["error"]["message"].startswith(
        "the engine worker crashed while running this request on its own (the worker process "
        "died (killed by signal 9); its output: "
    )
    # Each worker's log holds what it held at each death, so a crash can be traced to requests.
    logs = "".join(p.read_text() for p in sorted((job / "logs").glob("worker-*.log")))
    assert "=== in flight at its death (1): 'r7'" in logs
    assert "=== in flight at its death (1): 'r41'" in logs
    # Not retried by the retry passes, and a resume has nothing left to run.
    again = rerun("resume", job, env=env)
    assert again.returncode == 1
    assert Counter(rec["custom_id"] for rec in journal_records(job)) == counts


def test_isolation_costs_at_most_log2_of_what_the_worker_held(tmp_path: Path) -> None:
    src = chat_input(tmp_path / "in.jsonl", 200, max_tokens=4)
    job = tmp_path / "job"
    r = submit_echo(src, job, "--batch-size", "64", env={"BATCHRUN_ECHO_CRASH_ON": "r150"})
    assert r.returncode == 1, r.stderr
    starts = r.stderr.count("starting echo engine")
    # What the worker held at its first death: at most its window of 64 plus 64 prefetched.
    found = re.search(r"died holding (\d+) requests", r.stderr)
    assert found, r.stderr
    held = int(found.group(1))
    assert 2 <= held <= 128
    bound = math.ceil(math.log2(held))
    assert f"at most {bound} more restarts" in r.stderr
    assert starts - 1 <= 1 + bound
    assert "It is recorded as failed (engine_crash) and not retried; finding it took" in r.stderr


def test_retry_failed_runs_a_poison_request_again_on_demand(tmp_path: Path) -> None:
    src = chat_input(tmp_path / "in.jsonl", 10, max_tokens=4)
    job = tmp_path / "job"
    r = submit_echo(src, job, "--batch-size", "4", env={"BATCHRUN_ECHO_CRASH_ON": "r3"})
    assert r.returncode == 1, r.stderr
    # The engine was fixed (here: the fault is gone): retry-failed runs it and it succeeds.
    again = rerun("retry-failed", job)
    assert again.returncode == 0, again.stderr
    last = {rec["custom_id"]: rec for rec in journal_records(job)}
    assert last["r3"]["ok"] is True and last["r3"]["attempt"] == 2


def test_an_engine_that_crashes_on_every_request_gives_up_with_one_line(tmp_path: Path) -> None:
    src = chat_input(tmp_path / "in.jsonl", 12, max_tokens=4)
    job = tmp_path / "job"
    every = ",".join(f"r{i}" for i in range(12))
    r = submit_echo(src, job, "--batch-size", "4", env={"BATCHRUN_ECHO_CRASH_ON": every})
    assert r.returncode == 1
    assert "Traceback" not in r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("error: 3 requests in a row crashed the engine worker on their own")
    assert last.endswith("Everything finished so far is saved")
    counts = json.loads(cli("status", "--job-dir", str(job), "--json").stdout)["requests"]
    assert (counts["failed"], counts["pending"], counts["succeeded"]) == (3, 9, 0)
