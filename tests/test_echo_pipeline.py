"""The whole pipeline on the echo engine, through the real CLI in real subprocesses.

The echo engine stands in for vLLM only where a test needs faults vLLM cannot be made to show on
demand (failures, crashes, out-of-memory) or many fast requests; tests/vllm/test_vllm_e2e.py runs the
real engine.
"""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

import pytest
from support.cli import cli
from support.jobs import echo_args, journal_records, rerun, start_echo, submit_echo
from support.lines import chat_input, chat_line, read_jsonl, write_jsonl
from support.processes import kill_9_after
from support.waits import results_at_least, wait_until


def test_submit_export_round_trip_with_a_bad_line(tmp_path: Path) -> None:
    lines = [
        chat_line("a", "hello there"),
        "{not json",
        chat_line("b", "second one"),
        chat_line("a", "dup"),
    ]
    src = write_jsonl(tmp_path / "in.jsonl", lines)
    job = tmp_path / "job"
    r = submit_echo(src, job)
    assert r.returncode == 1, r.stderr  # finished, with invalid lines
    assert "Traceback" not in r.stderr
    r = cli("export", "--job-dir", str(job))
    assert r.returncode == 0, r.stderr
    out = read_jsonl(job / "output.jsonl")
    assert [o["custom_id"] for o in out] == ["a", "b"]
    assert out[0]["response"]["body"]["choices"][0]["message"]["content"] == "hello there"
    errors = read_jsonl(job / "errors.jsonl")
    assert [(e["custom_id"], e["error"]["line"], e["error"]["code"]) for e in errors] == [
        (None, 2, "invalid_json"),
        ("a", 4, "duplicate_custom_id"),
    ]


def test_a_dry_run_refuses_what_does_not_fit_the_context_as_vllm_would(tmp_path: Path) -> None:
    """The echo engine counts words as tokens against --max-model-len."""
    lines = [
        chat_line("fits", "one two three", max_tokens=4),
        chat_line("long-prompt", " ".join(["word"] * 9)),
        chat_line("long-answer", "one two", max_tokens=100),
    ]
    src = write_jsonl(tmp_path / "in.jsonl", lines)
    job = tmp_path / "job"
    r = submit_echo(src, job, "--max-model-len", "8")
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert cli("export", "--job-dir", str(job)).returncode == 0
    assert [o["custom_id"] for o in read_jsonl(job / "output.jsonl")] == ["fits"]
    errors = {e["custom_id"]: e for e in read_jsonl(job / "errors.jsonl")}
    assert set(errors) == {"long-prompt", "long-answer"}
    for e in errors.values():
        assert (
            e["response"]["status_code"] == 400 and e["error"]["code"] == "context_length_exceeded"
        )
    assert "the prompt has 9 tokens and 1 token" in errors["long-prompt"]["error"]["message"]
    assert "100 completion tokens" in errors["long-answer"]["error"]["message"]


def test_retry_passes_then_retry_failed_after_the_fault_is_gone(tmp_path: Path) -> None:
    src = chat_input(tmp_path / "in.jsonl", 20, max_tokens=8)
    job = tmp_path / "job"
    env = {"BATCHRUN_ECHO_FAIL": "r3,r7"}
    r = submit_echo(src, job, "--max-attempts", "2", env=env)
    assert r.returncode == 1
    recs = [x for x in journal_records(job) if x["kind"] == "result"]
    attempts = {}
    for x in recs:
        attempts.setdefault(x["custom_id"], []).append((x["attempt"], x["ok"]))
    assert attempts["r3"] == [(1, False), (2, False)]
    assert attempts["r0"] == [(1, True)]
    # The fault is gone: one more pass fixes exactly the two failures and touches nothing else.
    record = tmp_path / "received.txt"
    r = rerun("retry-failed", job, env={"BATCHRUN_ECHO_RECORD": str(record)})
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(record.read_text().split()) == ["r3", "r7"]
    cli("export", "--job-dir", str(job))
    assert len(read_jsonl(job / "output.jsonl")) == 20
    assert read_jsonl(job / "errors.jsonl") == []
    status = json.loads(cli("status", "--job-dir", str(job), "--json").stdout)
    assert status["requests"]["succeeded"] == 20 and status["requests"]["failed"] == 0
    assert status["attempts"] == 20 + 2 + 2


def test_worker_crashes_lose_nothing_and_the_job_finishes(tmp_path: Path) -> None:
    src = chat_input(tmp_path / "in.jsonl", 300, max_tokens=8)
    job = tmp_path / "job"
    env = {"BATCHRUN_ECHO_CRASH_AFTER": "70", "BATCHRUN_ECHO_DELAY_MS": "5"}
    r = submit_echo(src, job, "--batch-size", "16", env=env)
    assert r.returncode == 0, r.stderr
    # At most its window of 16 + 16 prefetched (fewer when the parent had not refilled it yet).
    died = re.search(r"^\[batchrun\] worker 0 died holding (\d+) requests?", r.stderr, re.M)
    assert died is not None and 1 <= int(died.group(1)) <= 32, r.stderr
    assert "Running them again in halves, each alone" in r.stderr
    recs = journal_records(job)
    ids = [x["custom_id"] for x in recs]
    assert sorted(ids) == sorted(f"r{i}" for i in range(300))  # each exactly once
    assert all(x["attempt"] == 1 for x in recs)  # a worker death is not an attempt
    # Each worker's own output goes to its log in the job directory, named in the death message;
    # every generation of the worker appends a header of its own.
    log = (job / "logs" / "worker-0.log").resolve()
    assert f"its output: {log}" in r.stderr
    assert log.read_text().count("=== worker 0, pid ") >= 2


def test_simulated_oom_backs_off_and_finishes(tmp_path: Path) -> None:
    src = chat_input(tmp_path / "in.jsonl", 400, max_tokens=8)
    job = tmp_path / "job"
    env = {"BATCHRUN_ECHO_OOM_ABOVE": "40", "BATCHRUN_ECHO_DELAY_MS": "2"}
    r = submit_echo(src, job, "--batch-size", "128", env=env)
    assert r.returncode == 0, r.stderr
    assert "ran out of memory at batch size 128" in r.stderr
    assert "batch size 128 -> 64" in r.stderr and "batch size 64 -> 32" in r.stderr
    assert len(journal_records(job)) == 400


@pytest.mark.slow
def test_batch_size_search_finds_the_largest_size_that_fits(tmp_path: Path) -> None:
    src = chat_input(tmp_path / "in.jsonl", 2000, max_tokens=8)
    job = tmp_path / "job"
    env = {"BATCHRUN_ECHO_OOM_ABOVE": "100", "BATCHRUN_ECHO_DELAY_MS": "20"}
    r = submit_echo(src, job, env=env)
    assert r.returncode == 0, r.stderr
    status = json.loads(cli("status", "--job-dir", str(job), "--json").stdout)
    probes = {p["size"]: p["ok"] for p in status["probes"]}
    assert probes[256] is False and probes[128] is False and probes[64] is True
    assert status["batch_size"] <= 64 and status["batch_size_source"] == "search"
    assert status["requests"]["succeeded"] == 2000


@pytest.mark.slow
def test_kill_9_of_submit_then_resume_runs_only_what_is_left(tmp_path: Path) -> None:
    src = chat_input(tmp_path / "in.jsonl", 600, max_tokens=8)
    job = tmp_path / "job"
    record = tmp_path / "received.txt"
    env = {"BATCHRUN_ECHO_DELAY_MS": "50", "BATCHRUN_ECHO_RECORD": str(record)}
    p = start_echo(src, job, "--batch-size", "16", env=env)
    kill_9_after(p, job, 100, timeout=60)
    done_before = {x["custom_id"] for x in journal_records(job)}
    assert 100 <= len(done_before) < 600
    record.unlink()
    r = rerun("resume", job, env={"BATCHRUN_ECHO_RECORD": str(record)})
    assert r.returncode == 0, r.stderr
    received = set(record.read_text().split())
    assert not (received & done_before)  # the engine got none of the finished work
    cli("export", "--job-dir", str(job))
    out = read_jsonl(job / "output.jsonl")
    assert sorted(o["custom_id"] for o in out) == sorted(f"r{i}" for i in range(600))


def test_ctrl_c_flushes_and_exits_130_then_resume_finishes(tmp_path: Path) -> None:
    src = chat_input(tmp_path / "in.jsonl", 400, max_tokens=8)
    job = tmp_path / "job"
    p = start_echo(src, job, "--batch-size", "8", env={"BATCHRUN_ECHO_DELAY_MS": "50"})
    wait_until(results_at_least(job, 20), "20 results are journaled", timeout=60)
    os.killpg(p.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
    _, stderr = p.communicate(timeout=60)
    assert p.returncode == 130, stderr
    assert "batchrun resume --job-dir" in stderr and "Traceback" not in stderr
    status = json.loads(cli("status", "--job-dir", str(job), "--json").stdout)
    assert status["status"] == "interrupted"
    assert 0 < status["requests"]["succeeded"] < 400
    r = rerun("resume", job)
    assert r.returncode == 0
    assert sorted(x["custom_id"] for x in journal_records(job)) == sorted(
        f"r{i}" for i in range(400)
    )


def test_a_second_resume_is_refused_while_one_runs(tmp_path: Path) -> None:
    src = chat_input(tmp_path / "in.jsonl", 200, max_tokens=8)
    job = tmp_path / "job"
    p = start_echo(src, job, "--batch-size", "4", env={"BATCHRUN_ECHO_DELAY_MS": "100"})
    try:
        wait_until((job / "manifest.json").exists, "the job's manifest is written", timeout=60)
        r = rerun("resume", job)
        assert r.returncode == 1
        assert f"already running in process {p.pid}" in r.stderr
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def test_resume_refuses_a_changed_input_file(tmp_path: Path) -> None:
    src = chat_input(tmp_path / "in.jsonl", 5, max_tokens=8)
    job = tmp_path / "job"
    assert submit_echo(src, job).returncode == 0
    with src.open("a") as f:
        f.write(json.dumps(chat_line("extra", "new")) + "\n")
    r = rerun("resume", job)
    assert r.returncode == 1
    assert "changed since the job was submitted" in r.stderr


@pytest.mark.slow
def test_several_workers_share_one_queue_and_one_journal(tmp_path: Path) -> None:
    # Enough work (about 6 s for one worker alone) that each worker is ready before the
    # others could finish it all, even on a loaded machine.
    n = 4000
    src = chat_input(tmp_path / "in.jsonl", n, max_tokens=8)
    job = tmp_path / "job"
    env = {"BATCHRUN_ECHO_DELAY_MS": "25"}
    r = submit_echo(src, job, "--workers", "3", "--batch-size", "16", env=env)
    assert r.returncode == 0, r.stderr
    records = journal_records(job)
    assert sorted(x["custom_id"] for x in records) == sorted(f"r{i}" for i in range(n))
    # One journal, written by the parent, holds every worker's results.
    assert {x["worker"] for x in records} == {0, 1, 2}, r.stderr


def test_tune_searches_keeps_probe_results_and_resume_uses_the_size(tmp_path: Path) -> None:
    src = chat_input(tmp_path / "in.jsonl", 1500, max_tokens=8)
    job = tmp_path / "job"
    env = {"BATCHRUN_ECHO_OOM_ABOVE": "100", "BATCHRUN_ECHO_DELAY_MS": "20"}
    r = cli("tune", str(src), "--job-dir", str(job), "--engine", "echo", "--no-progress", env=env)
    assert r.returncode == 0, r.stderr
    assert "batch-size probes" in r.stdout and "OOM" in r.stdout
    probed = len(journal_records(job))
    assert probed > 0  # the probes' answers are kept, not thrown away
    status = json.loads(cli("status", "--job-dir", str(job), "--json").stdout)
    size = status["batch_size"]
    assert size <= 100 and status["requests"]["pending"] == 1500 - probed
    r = rerun("resume", job, env=env)
    assert r.returncode == 0
    assert f"batch size {size} (search)" in r.stderr
    assert "probing" not in r.stderr  # resume does not search again
    assert sorted(x["custom_id"] for x in journal_records(job)) == sorted(
        f"r{i}" for i in range(1500)
    )


@pytest.mark.parametrize("to_group", [False, True], ids=["to-batchrun", "to-its-group"])
def test_sigterm_flushes_and_exits_143(tmp_path: Path, to_group: bool) -> None:
    """SIGTERM to batchrun alone (a scheduler, `kill`), or to its whole process group (`kill --
    -PGID`, a service manager stopping its unit): a graceful stop either way. The worker leaves
    stopping to its parent; it is not seen to die, nor restarted."""
    src = chat_input(tmp_path / "in.jsonl", 300, max_tokens=8)
    job = tmp_path / "job"
    p = start_echo(src, job, "--batch-size", "8", env={"BATCHRUN_ECHO_DELAY_MS": "50"})
    wait_until(results_at_least(job, 10), "10 results", timeout=60)
    if to_group:
        os.killpg(p.pid, signal.SIGTERM)
    else:
        p.send_signal(signal.SIGTERM)
    _, stderr = p.communicate(timeout=60)
    assert p.returncode == 143, stderr
    assert "terminated" in stderr and "batchrun resume" in stderr
    assert " died" not in stderr and stderr.count("starting echo engine") == 1, stderr
    assert rerun("resume", job).returncode == 0
    assert sorted(x["custom_id"] for x in journal_records(job)) == sorted(
        f"r{i}" for i in range(300)
    )


# A SIGTERM whose handler runs inside a finalizer: Python prints its exception as "Exception
# ignored" and drops it (as it did when the signal met an import's module lock). Then the job.
LOST_STOP = """
import os, signal, sys
from batchrun.__main__ import main
from batchrun import stopping

class Finalizer:
    def __del__(self) -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(100_000):  # the handler runs here, and its raise goes nowhere
            pass

stopping.install()
Finalizer()
assert stopping.exit_code() == 143, "the handler did not run inside the finalizer"
sys.argv = ["batchrun", *sys.argv[1:]]
main()
"""


def test_a_stop_signal_whose_exception_python_dropped_still_stops_the_job(
    tmp_path: Path,
) -> None:
    """The handler's raise lost in a finalizer: the run raises it again at its next wait, so
    the job stops with 143 and the resume hint instead of running on as if no signal came."""
    import subprocess
    import sys

    src = chat_input(tmp_path / "in.jsonl", 200, max_tokens=8)
    job = tmp_path / "job"
    proc = subprocess.run(
        [sys.executable, "-c", LOST_STOP, "submit", str(src), "--job-dir", str(job),
         "--engine", "echo", "--batch-size", "8", "--no-progress"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "BATCHRUN_ECHO_DELAY_MS": "50"},
    )  # fmt: skip
    assert "Exception ignored" in proc.stderr, proc.stderr  # the raise was indeed lost
    assert proc.returncode == 143, proc.stderr
    assert "terminated" in proc.stderr and "batchrun resume" in proc.stderr, proc.stderr
    done = len(journal_records(job))
    assert done < 200, "the job ran to its end as if no signal had come"
    assert rerun("resume", job).returncode == 0
    assert sorted(x["custom_id"] for x in journal_records(job)) == sorted(
        f"r{i}" for i in range(200)
    )


def test_a_full_disk_stops_the_job_clearly_and_resume_completes_it(tmp_path: Path) -> None:
    import resource
    import subprocess
    import sys

    src = chat_input(tmp_path / "in.jsonl", 400, max_tokens=8)
    job = tmp_path / "job"

    def limit_file_size() -> None:
        # Writes past 40 kB fail with EFBIG, as on a full disk (ENOSPC takes the same path).
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (40_000, 40_000))

    proc = subprocess.run(
        [sys.executable, "-m", "batchrun", *echo_args(src, job, "--batch-size", "16")],
        capture_output=True,
        text=True,
        preexec_fn=limit_file_size,
        timeout=120,
        env={**os.environ, "BATCHRUN_ECHO_DELAY_MS": "5"},
    )
    assert proc.returncode == 1, proc.stderr
    # Whichever file filled first: a worker's shard of bodies, or the journal (whose torn last
    # line is cut when it opens again).
    (said,) = [x for x in proc.stderr.splitlines() if x.startswith("error:")]
    assert "cannot write the result shard" in said or "cannot write the journal" in said, said
    assert "Traceback" not in proc.stderr
    from batchrun.job.journal import read_records

    partial = {x["custom_id"] for x in read_records(job / "journal.jsonl")}
    assert 0 < len(partial) < 400  # every whole line before it is kept
    r = rerun("resume", job)  # space is back
    assert r.returncode == 0, r.stderr
    ids = [x["custom_id"] for x in journal_records(job)]
    assert sorted(ids) == sorted(f"r{i}" for i in range(400))


def test_resume_force_runs_the_changed_file_without_rerunning_finished_work(tmp_path: Path) -> None:
    src = chat_input(tmp_path / "in.jsonl", 5, max_tokens=8)
    job = tmp_path / "job"
    assert submit_echo(src, job).returncode == 0
    with src.open("a") as f:
        f.write(json.dumps(chat_line("extra", "new")) + "\n")
    record = tmp_path / "received.txt"
    r = rerun("resume", job, "--force", env={"BATCHRUN_ECHO_RECORD": str(record)})
    assert r.returncode == 0, r.stderr
    assert record.read_text().split() == ["extra"]
    status = json.loads(cli("status", "--job-dir", str(job), "--json").stdout)
    assert status["requests"]["valid"] == 6 and status["requests"]["succeeded"] == 6


@pytest.mark.slow
def test_kill_9_of_the_worker_alone_loses_nothing(tmp_path: Path) -> None:
    from support.processes import worker_pids

    src = chat_input(tmp_path / "in.jsonl", 400, max_tokens=8)
    job = tmp_path / "job"
    p = start_echo(src, job, "--batch-size", "8", env={"BATCHRUN_ECHO_DELAY_MS": "30"})
    wait_until(results_at_least(job, 40), "40 results are journaled", timeout=60)
    pids = worker_pids(p.pid)
    assert len(pids) == 1
    os.kill(pids[0], signal.SIGKILL)
    _, stderr = p.communicate(timeout=120)
    assert p.returncode == 0, stderr
    assert "killed by signal 9" in stderr and "starting a fresh worker" in stderr
    recs = journal_records(job)
    assert sorted(x["custom_id"] for x in recs) == sorted(f"r{i}" for i in range(400))
