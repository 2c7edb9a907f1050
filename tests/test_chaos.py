"""Kills, interrupts and torn state at awkward moments, through the real CLI in real processes.

- A fast run of the crash harness (scripts/chaos.py): SIGKILLs of the whole process group at
  random (seeded) moments, `resume` after each, then every invariant checked; one with graceful
  stops (SIGINT, SIGTERM, two SIGINTs) instead; and runs with a planted bug, which the checker
  must report (a checker that cannot fail proves nothing).
- A second Ctrl-C while the first one is being handled: the process stops (it must not hang), the
  journal replays, `resume` completes the job.
- Interrupted submits: killed or interrupted while validating, before the job exists.
- SIGTERM at any moment exits 143, not 130.

tests/test_echo_pipeline.py covers the single kill -9 + resume, Ctrl-C (130), SIGTERM (143), a
full disk, a changed input and a second resume; tests/test_job.py and tests/test_journal.py the
damaged manifest, the stale lock, the torn tail and the garbage line.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from support.advice import advised, follow
from support.cli import cli, start_cli
from support.jobs import journal_records, rerun, start_echo, submit_echo
from support.lines import chat_input, chat_line, read_jsonl, write_jsonl
from support.paths import ROOT
from support.processes import kill_group
from support.waits import wait_until

pytestmark = pytest.mark.slow  # out of the fast tier: docs/development.md

CHAOS = ROOT / "scripts" / "chaos.py"


def run_chaos(tmp_path: Path, *args: str, timeout: float = 600) -> tuple[int, dict[str, Any], str]:
    """Run the harness; return its exit code, its JSON report and its output."""
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, str(CHAOS), "--work-dir", str(tmp_path / "work"), "--report", str(report),
         "-q", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )  # fmt: skip
    data = json.loads(report.read_text()) if report.exists() else {}
    return proc.returncode, data, proc.stdout + proc.stderr


# --- the crash harness ----------------------------------------------------------------------


def test_chaos_fast_run_loses_nothing_and_answers_nothing_twice(tmp_path: Path) -> None:
    """10 SIGKILLs of submit/resume at random moments (the first one while submit validates),
    with 3 poison requests that crash the worker; then every valid request exactly once with its
    answer (the poison ones as engine_crash), every invalid line once, status matching the files."""
    rc, rep, out = run_chaos(tmp_path, "--kills", "10", "--requests", "800", "--seed", "4242")
    assert rep, out
    assert rep["violation_list"] == [], out
    assert rc == 0, out
    assert rep["kills_survived"] == 10
    assert (
        rep["rows_checked"] == rep["requests"] + rep["invalid_lines"] == 800 + rep["invalid_lines"]
    )
    assert rep["invalid_kinds"] >= 5
    # Poison requests among the kills: each isolated and failed alone (checked per request).
    assert rep["poison"] == 3 and rep["poison_received"] >= 3
    assert rep["violations"] == 0


def test_chaos_serve_killed_between_an_output_file_and_its_record_makes_each_file_once(
    tmp_path: Path,
) -> None:
    """`--serve`: the server SIGKILLed after making a batch's output file, before saving its id
    (and at a random moment before, every other cycle): after each restart the batch completes
    with one output file and one error file, nothing left over."""
    code, report, out = run_chaos(
        tmp_path, "--serve", "2", "--serve-requests", "60", "--delay-ms", "5", "--seed", "3",
        timeout=300,
    )  # fmt: skip
    assert code == 0, out
    assert report["violations"] == []
    assert report["serve_kills"] == {"output_window": 2, "random": 1}


def test_chaos_graceful_stops_exit_130_or_143_and_leave_a_working_hint(tmp_path: Path) -> None:
    """SIGINT to the group, SIGTERM to batchrun, or two SIGINTs, at random moments: each exits
    130/143 with no traceback, a flushed journal and a hint that works; nothing is lost."""
    rc, rep, out = run_chaos(
        tmp_path, "--kills", "8", "--requests", "600", "--seed", "99", "--graceful", "1.0"
    )
    assert rep, out
    assert rep["violation_list"] == [], out
    assert rc == 0, out
    assert rep["graceful_stops"] >= 7  # the first stop (aimed at validation) is a SIGKILL


@pytest.mark.ray
def test_chaos_on_ray_actors_killed_and_runs_resumed_with_and_without_ray(tmp_path: Path) -> None:
    """The harness with --ray local: Ray actors SIGKILLed mid-run (the last run always loses
    one and must replace it), whole runs SIGKILLed, some resumed without Ray; nothing lost."""
    rc, rep, out = run_chaos(tmp_path, "--ray", "--kills", "4", "--requests", "600", "--seed", "11")
    assert rep, out
    assert rep["violation_list"] == [], out
    assert rc == 0, out
    assert rep["ray_actors_killed"] >= 1 and rep["ray_actors_replaced"] >= 1, out
    assert rep["rows_checked"] == 600 + rep["invalid_lines"]


@pytest.mark.parametrize(
    ("plant", "symptom"),
    [
        ("duplicate-result", "answered twice"),
        ("drop-result", "(lost)"),
        ("drop-invalid", "(lost)"),
    ],
)
def test_chaos_checker_reports_a_planted_bug(tmp_path: Path, plant: str, symptom: str) -> None:
    """The harness must be able to fail: corrupt the journal on purpose, expect a violation."""
    rc, rep, out = run_chaos(
        tmp_path, "--kills", "4", "--requests", "300", "--seed", "7", "--plant-bug", plant
    )
    assert rep, out  # the harness ran to its report (it did not crash)
    assert rc == 1, out
    assert rep["planted_bug"], out
    assert rep["violations"] > 0
    assert any(symptom in v for v in rep["violation_list"]), rep["violation_list"]


# --- a second Ctrl-C ------------------------------------------------------------------------


def wait_for_records(job: Path, n: int, timeout: float = 120) -> None:
    path = job / "journal.jsonl"
    wait_until(
        lambda: path.exists() and path.read_bytes().count(b'"kind":"result"') >= n,
        f"the job reached {n} results",
        timeout=timeout,
        every=0.02,
    )


def assert_journal_replays(job: Path) -> set[str]:
    """Every whole line is a record (a torn last line is allowed: it is cut on open); returns
    the ids with a result, and checks none has two."""
    raw = (job / "journal.jsonl").read_bytes()
    lines = raw.split(b"\n")[:-1]
    ids: list[str] = []
    for n, line in enumerate(lines, start=1):
        rec = json.loads(line)  # raises on a corrupt line
        assert isinstance(rec, dict) and "kind" in rec, f"journal line {n}"
        if rec["kind"] == "result":
            ids.append(rec["custom_id"])
    assert len(ids) == len(set(ids)), "a request was answered twice"
    return set(ids)


def test_a_second_ctrl_c_stops_at_once_and_the_job_still_completes(tmp_path: Path) -> None:
    """SIGINT twice in quick succession (gaps from 0 to 50 ms), five times over on one job."""
    n = 3000
    src = chat_input(tmp_path / "in.jsonl", n)
    job = tmp_path / "job"
    env = {"BATCHRUN_ECHO_DELAY_MS": "50"}
    done = 0
    for i, gap in enumerate([0.0, 0.001, 0.005, 0.02, 0.05]):
        if i == 0:
            args = ["submit", str(src), "--job-dir", str(job), "--engine", "echo"]
            args += ["--batch-size", "8", "--no-progress"]
        else:
            args = ["resume", "--job-dir", str(job), "--no-progress"]
        p = start_cli(*args, env=env)
        try:
            wait_for_records(job, done + 20)
            os.killpg(p.pid, signal.SIGINT)
            time.sleep(gap)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGINT)
            try:
                _, stderr = p.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                pytest.fail(f"after two SIGINTs {gap * 1000:.0f} ms apart batchrun did not exit")
        finally:
            kill_group(p)
        # -2: the second SIGINT came while Python was shutting down; a shell shows 130 too.
        assert p.returncode in (130, 1, -2), (gap, p.returncode, stderr)
        assert "Traceback" not in stderr, (gap, stderr)
        done = len(assert_journal_replays(job))
    r = rerun("resume", job, env=env)
    assert r.returncode == 0, r.stderr
    ids = [x["custom_id"] for x in journal_records(job) if x["kind"] == "result"]
    assert sorted(ids) == sorted(f"r{i}" for i in range(n))  # each exactly once


SECOND_INTERRUPT_WHILE_STOPPING = """
import sys

if __name__ == "__main__":
    from batchrun.workers import process as supervisor

    stop = supervisor.Worker.stop
    calls = []

    def interrupted_stop(self, timeout=10.0):
        calls.append(1)
        if len(calls) == 1:
            # A second Ctrl-C that lands while the first one is stopping the engine worker.
            raise KeyboardInterrupt
        return stop(self, timeout)

    supervisor.Worker.stop = interrupted_stop
    from batchrun.cli import main

    sys.argv = ["batchrun", *sys.argv[1:]]
    main()
"""


def test_a_second_ctrl_c_while_the_worker_is_being_stopped_does_not_hang(tmp_path: Path) -> None:
    """The moment above that real signals hit only now and then, made certain: the worker must
    not be left running (the exiting parent would wait for it forever)."""
    script = tmp_path / "interrupted_stop.py"
    script.write_text(SECOND_INTERRUPT_WHILE_STOPPING)
    src = chat_input(tmp_path / "in.jsonl", 400)
    job = tmp_path / "job"
    p = subprocess.Popen(
        [sys.executable, str(script), "submit", str(src), "--job-dir", str(job),
         "--engine", "echo", "--batch-size", "8", "--no-progress"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "BATCHRUN_ECHO_DELAY_MS": "50"},
        start_new_session=True,
    )  # fmt: skip
    try:
        wait_for_records(job, 20)
        os.killpg(p.pid, signal.SIGINT)
        try:
            _, stderr = p.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail("a Ctrl-C while stopping the worker left batchrun hanging at exit")
    finally:
        kill_group(p)
    assert p.returncode in (130, 1), stderr
    assert_journal_replays(job)
    r = rerun("resume", job)
    assert r.returncode == 0, r.stderr


# --- interrupted submits --------------------------------------------------------------------


def test_a_submit_killed_while_validating_can_simply_be_run_again(tmp_path: Path) -> None:
    """submit journals the invalid lines, then writes the manifest. Killed in between, the job
    directory holds a journal and no manifest; running the same submit again must not record
    every invalid line a second time (status would count them twice)."""
    lines: list[Any] = [chat_line(f"r{i}", f"message {i}") for i in range(20)]
    lines[3] = "{not json"
    lines[9] = chat_line("r1", "a duplicate id")
    src = write_jsonl(tmp_path / "in.jsonl", lines)
    # The state such a kill leaves, built on disk: the invalid lines' records, no manifest.
    done = tmp_path / "done"
    submit_echo(src, done)
    invalid = [x for x in journal_records(done) if x["kind"] == "invalid"]
    assert len(invalid) == 2
    job = tmp_path / "job"
    job.mkdir()
    write_jsonl(job / "journal.jsonl", invalid)
    (job / "lock").write_text("12345\n")  # left by the killed process
    r = submit_echo(src, job)
    assert r.returncode == 1, r.stderr  # finished, with 2 invalid lines
    assert "Traceback" not in r.stderr
    status = json.loads(cli("status", "--job-dir", str(job), "--json").stdout)
    assert cli("export", "--job-dir", str(job)).returncode == 0
    errors = read_jsonl(job / "errors.jsonl")
    assert [e["error"]["line"] for e in errors] == [4, 10]
    assert status["requests"]["invalid"] == len(errors) == 2
    assert status["requests"]["total"] == 20
    assert sum(1 for x in journal_records(job) if x["kind"] == "invalid") == 2


def test_ctrl_c_while_submit_validates_gives_a_hint_that_works(tmp_path: Path) -> None:
    """Interrupted before the job exists, batchrun must not send the user to a `resume` that
    refuses; whatever it says to run next must work and count every line once."""
    src = tmp_path / "in.jsonl"
    with src.open("w") as f:
        for i in range(10):
            f.write(json.dumps(chat_line(f"ok{i}", "hi")) + "\n")
        for i in range(100_000):  # long enough to validate that the interrupt lands in it
            f.write(f'{{"custom_id": "g{i}", "method": "GET"}}\n')
    job = tmp_path / "job"
    p = start_echo(src, job)
    wait_until((job / "lock").exists, "submit takes the job's lock", timeout=60, every=0.005)
    time.sleep(0.2)
    os.killpg(p.pid, signal.SIGINT)
    _, stderr = p.communicate(timeout=60)
    assert p.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert not (job / "manifest.json").exists(), "the interrupt came after validation: too late"
    # The hint, run as printed (tests/support/advice.py): the same submit again, never a resume.
    said = stderr.strip().splitlines()[-1]
    assert said.startswith("interrupted: stopped before the job was created"), stderr
    (again,) = advised(said)
    assert again[0] == "submit", said
    r = follow(again)
    assert r.returncode == 1 and "error:" not in r.stderr, (stderr, r.stderr)
    status = json.loads(cli("status", "--job-dir", str(job), "--json").stdout)
    assert status["requests"]["invalid"] == 100_000 and status["requests"]["succeeded"] == 10


SIGTERM_IN_START_UP = """
import os, signal, sys, types

if __name__ == "__main__":
    import batchrun.run.jobs as real

    def __getattr__(name):
        if name == "continue_job":
            # SIGTERM while the command is being set up, before it is under way.
            os.kill(os.getpid(), signal.SIGTERM)
        return getattr(real, name)

    proxy = types.ModuleType("batchrun.run.jobs")
    proxy.__getattr__ = __getattr__
    sys.modules["batchrun.run.jobs"] = proxy
    from batchrun.cli import main

    sys.argv = ["batchrun", *sys.argv[1:]]
    main()
"""


def test_sigterm_while_the_command_starts_exits_143(tmp_path: Path) -> None:
    """Typer turns a KeyboardInterrupt (which SIGTERM becomes) raised outside the command's own
    handler into a silent exit 130; a SIGTERM must exit 143 whenever it comes."""
    script = tmp_path / "term_in_start_up.py"
    script.write_text(SIGTERM_IN_START_UP)
    r = subprocess.run(
        [sys.executable, str(script), "resume", "--job-dir", str(tmp_path / "job")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert r.returncode == 143, (r.returncode, r.stderr)


def test_submit_never_discards_a_journal_with_results_whose_manifest_is_missing(
    tmp_path: Path,
) -> None:
    """Only what a submit stopped while validating leaves (invalid-line records) is dropped on a
    new submit; finished results without their manifest are refused, and export still works."""
    src = chat_input(tmp_path / "in.jsonl", 5)
    job = tmp_path / "job"
    r = submit_echo(src, job)
    assert r.returncode == 0, r.stderr
    (job / "manifest.json").unlink()
    before = (job / "journal.jsonl").read_bytes()
    r = submit_echo(src, job)
    assert r.returncode == 1
    assert "holds a journal with finished requests but no manifest.json" in r.stderr, r.stderr
    assert (job / "journal.jsonl").read_bytes() == before
    r = cli("resume", "--job-dir", str(job))
    assert r.returncode == 1 and "has a journal but no manifest.json" in r.stderr, r.stderr
    r = cli("export", "--job-dir", str(job))
    assert r.returncode == 0, r.stderr
    assert [x["custom_id"] for x in read_jsonl(job / "output.jsonl")] == [f"r{i}" for i in range(5)]
