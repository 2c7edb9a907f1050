"""A new job's engine starts while its input is validated (run/early_start.py), and a job's end
does not wait for its workers' exit: real submit processes, real signals, the echo engine."""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path
from typing import Any

import pytest
from support.cli import cli, cli_process
from support.jobs import start_echo, submit_echo
from support.lines import chat_line, write_jsonl
from support.processes import group_alive
from support.waits import results_at_least, wait_until

from batchrun.openai.records import EMBEDDINGS
from batchrun.run.early_start import PEEK_LINES, first_endpoint
from batchrun.run.source import InputIndex

pytestmark = pytest.mark.usefixtures("fresh_size_cache")


def _lines(n: int) -> list[str]:
    """`n` short chat lines, as strings (a file large enough to validate for a while)."""
    template = json.dumps(chat_line("ID", "hello there, a short prompt", max_tokens=4))
    return [template.replace('"ID"', f'"r{i}"') for i in range(n)]


def _events(job: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (job / "events.jsonl").read_text().splitlines()]


def test_the_engine_starts_before_validation_ends_and_the_run_keeps_it(tmp_path: Path) -> None:
    """The worker's process is up before the input is validated, it is the run's one start (no
    restart), at the batch size the run uses, and it is gone after the command's exit."""
    inp = write_jsonl(tmp_path / "in.jsonl", _lines(40_000))
    job = tmp_path / "job"
    r = submit_echo(inp, job, process=True, progress=True)
    assert r.returncode == 0, r.stderr
    starts = re.findall(r"worker 0 starting echo engine \(pid (\d+)", r.stderr)
    assert len(starts) == 1, r.stderr
    # Said before the validation's own lines and the search's.
    assert r.stderr.index("starting echo engine") < r.stderr.index("batch size")
    events = _events(job)
    ready = [e for e in events if e["kind"] == "ready"]
    assert len(ready) == 1 and not [e for e in events if e["kind"] == "restart"]
    manifest = json.loads((job / "manifest.json").read_text())
    assert ready[0]["batch_size"] == manifest["probes"][0]["size"]
    (timeline,) = [e["marks"] for e in events if e["kind"] == "timeline"]
    worker = ready[0]["timeline"]
    # The kernel's start time of the worker, against the moment validation ended.
    assert worker["process_start"] < timeline["validated"], (worker, timeline)
    assert timeline["validated"] < timeline["first_result"] <= timeline["last_result"]
    assert manifest["counts"]["succeeded"] == 40_000
    # Its end was not waited for, but it ends: nothing is left running.
    pid = int(starts[0])
    wait_until(lambda: not group_alive(pid), "the worker's process group is gone", timeout=30)


def test_a_ctrl_c_during_validation_stops_the_engine_and_leaves_no_job(tmp_path: Path) -> None:
    """Interrupted while validating, submit exits 130 with its worker stopped and no job left
    behind: running the same submit again starts clean."""
    inp = write_jsonl(tmp_path / "in.jsonl", _lines(600_000))
    job = tmp_path / "job"
    proc = start_echo(inp, job, progress=True)
    assert proc.stderr is not None
    seen = ""
    while "starting echo engine" not in seen:
        line = proc.stderr.readline()
        assert line, f"submit ended before its worker started: {seen}"
        seen += line
    pid = int(re.findall(r"\(pid (\d+)", seen)[0])
    assert not (job / "manifest.json").exists()  # still validating
    os.kill(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, seen + err
    assert "Traceback" not in err
    assert not job.exists()
    wait_until(lambda: not group_alive(pid), "the early worker is gone", timeout=30)


def test_a_refused_input_starts_no_engine(tmp_path: Path) -> None:
    """A file with no valid line in its first lines starts nothing before validation, and one
    validation refuses leaves no job."""
    inp = write_jsonl(tmp_path / "in.jsonl", ["not json"] * 3)
    r = submit_echo(inp, tmp_path / "job", progress=True)
    assert r.returncode == 1
    assert "starting" not in r.stderr
    assert not (tmp_path / "job").exists()


def test_the_endpoint_is_the_first_valid_lines(tmp_path: Path) -> None:
    """The engine's kind (a pooling model for embeddings) comes from the first valid line, past
    broken ones; none within the first lines: no early start."""
    embedding = {
        "custom_id": "e1",
        "method": "POST",
        "url": EMBEDDINGS,
        "body": {"model": "m", "input": "a passage"},
    }
    inp = write_jsonl(tmp_path / "in.jsonl", ["{broken", {"custom_id": "x"}, embedding])
    assert first_endpoint(inp, InputIndex(None)) == EMBEDDINGS
    late = write_jsonl(tmp_path / "late.jsonl", ["{broken"] * PEEK_LINES + [embedding])
    assert first_endpoint(late, InputIndex(None)) is None
    assert first_endpoint(tmp_path / "missing.jsonl", InputIndex(None)) is None


def test_an_embeddings_job_runs_on_its_early_engine(tmp_path: Path) -> None:
    """An embeddings file (first line broken) runs on the engine started early: one start."""
    lines: list[Any] = ["{broken"]
    lines += [
        {
            "custom_id": f"e{i}",
            "method": "POST",
            "url": EMBEDDINGS,
            "body": {"model": "m", "input": f"passage {i}"},
        }
        for i in range(50)
    ]
    inp = write_jsonl(tmp_path / "in.jsonl", lines)
    job = tmp_path / "job"
    r = submit_echo(inp, job, process=True, progress=True)
    assert r.returncode == 1, r.stderr  # finished, with an invalid line
    assert r.stderr.count("starting echo engine") == 1
    events = _events(job)
    assert len([e for e in events if e["kind"] == "ready"]) == 1
    manifest = json.loads((job / "manifest.json").read_text())
    assert manifest["counts"]["succeeded"] == 50 and manifest["counts"]["invalid"] == 1


def _last_run(job: Path) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """The last run's timeline marks and its workers' "ready" events (with their timelines):
    those of workers born after the run's process (a killed run's came before and wrote no
    timeline)."""
    events = _events(job)
    marks = [e["marks"] for e in events if e["kind"] == "timeline"][-1]
    ready = [
        e
        for e in events
        if e["kind"] == "ready" and e["timeline"]["process_start"] >= marks["process_start"]
    ]
    return marks, ready


def _killed_job(tmp_path: Path, n: int, env: dict[str, str] | None = None) -> Path:
    """A job of `n` lines whose submit was killed with SIGKILL part way through its run."""
    inp = write_jsonl(tmp_path / "in.jsonl", _lines(n))
    job = tmp_path / "job"
    proc = start_echo(
        inp,
        job,
        "--batch-size",
        "64",
        env={"BATCHRUN_ECHO_DELAY_MS": "20", **(env or {})},
        progress=True,
    )
    try:
        wait_until(results_at_least(job, n // 4), "a quarter of the results", timeout=120)
        # The running job's summary is saved at a bounded rate: one is there to be trusted.
        wait_until(lambda: (job / "summary.json").exists(), "a saved summary", timeout=30)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=60)
    return job


def _continued_on_an_early_engine(job: Path, command: str, succeeded: int) -> dict[str, Any]:
    """Run `command` (resume, retry-failed) on `job`: it succeeds on one worker, started before
    the journal's replay ended, and leaves `succeeded` requests succeeded; its "ready" event."""
    r = cli_process(command, "--job-dir", str(job))
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("starting echo engine") == 1, r.stderr
    marks, ready = _last_run(job)
    assert len(ready) == 1
    assert ready[0]["timeline"]["process_start"] < marks["replayed"] < marks["first_result"]
    manifest = json.loads((job / "manifest.json").read_text())
    assert manifest["counts"]["succeeded"] == succeeded
    return ready[0]


def test_resume_starts_the_engine_before_the_journal_is_replayed(tmp_path: Path) -> None:
    """A killed job's resume starts its worker before it has replayed the journal, keeps it for
    the run (one start, at the job's batch size), and finishes the job."""
    job = _killed_job(tmp_path, 8_000)
    assert _continued_on_an_early_engine(job, "resume", 8_000)["batch_size"] == 64


def test_retry_failed_starts_the_engine_before_the_journal_is_replayed(tmp_path: Path) -> None:
    """retry-failed on a job with failed requests starts its worker early too, and answers them."""
    inp = write_jsonl(tmp_path / "in.jsonl", _lines(2_000))
    job = tmp_path / "job"
    failing = {"BATCHRUN_ECHO_FAIL": "r7,r1500"}
    r = submit_echo(inp, job, env=failing, process=True, progress=True)
    assert r.returncode != 0, r.stderr  # two requests failed
    _continued_on_an_early_engine(job, "retry-failed", 2_000)


def test_a_finished_job_resumed_starts_no_engine(tmp_path: Path) -> None:
    """Nothing left to run: resume and retry-failed start no worker, early or late."""
    inp = write_jsonl(tmp_path / "in.jsonl", _lines(500))
    job = tmp_path / "job"
    assert submit_echo(inp, job, progress=True).returncode == 0
    for command in ("resume", "retry-failed"):
        r = cli(command, "--job-dir", str(job))
        assert r.returncode == 0, r.stderr
        assert "starting" not in r.stderr, r.stderr
