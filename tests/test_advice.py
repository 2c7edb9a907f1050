"""Every piece of advice a job command prints, followed: each test runs the command the advice
names, as printed (tests/support/advice.py reads it back), and checks it does what the advice says.
Failures a retry cannot fix (job/lasting.py) are never sent to `retry-failed`: the advice names
what fixes them (a longer context, the input), and following it fixes them.

(serve's restart advice is tests/test_serve_restart.py's; the invalid-line advice is followed in
tests/test_options.py, the --input and --force advice in tests/test_job_lifecycle.py.)"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from support.advice import advised, follow, last_line
from support.cli import cli, error_line, start_cli
from support.jobs import ECHO, journal_records, rerun, start_echo, status_json, submit_echo
from support.lines import chat_input, chat_line, read_jsonl, write_jsonl
from support.processes import kill_group
from support.waits import results_at_least, wait_until

# Wide enough that no table row wraps.
WIDE = {"COLUMNS": "1000"}


def row(proc_stdout: str, name: str) -> str:
    """A table row's value (the summary's or status')."""
    (line,) = [ln for ln in proc_stdout.splitlines() if ln.startswith(f"│ {name} ")]
    return line.split("│")[2].strip()


def long_and_short(n_long: int, n_short: int) -> list[dict[str, Any]]:
    """Chat lines of 30 words (over a 16-token context with max_tokens 4) and of 3."""
    lines = [chat_line(f"long{i}", "word " * 30, max_tokens=4) for i in range(n_long)]
    return lines + [chat_line(f"short{i}", "a b c", max_tokens=4) for i in range(n_short)]


def test_requests_over_the_context_are_not_advised_for_retry_failed(tmp_path: Path) -> None:
    """Five lines over --max-model-len: counted as a retry cannot fix them, in the summary and
    in status; the advice is a longer context, which, followed, answers them."""
    src = write_jsonl(tmp_path / "in.jsonl", long_and_short(5, 3))
    job = tmp_path / "my job"
    r = submit_echo(src, job, "--max-model-len", "16", env=WIDE)
    assert r.returncode == 1, r.stderr
    assert (
        row(r.stdout, "failed")
        == "5 (a retry cannot fix 5: context_length_exceeded 5 needs a longer --max-model-len or a shorter input)"
    )
    said = last_line(r)
    q = f"'{job}'"
    assert said == (
        f"5 requests failed: see them with `batchrun export --job-dir {q}` (errors.jsonl). 5 are "
        "longer than the context (context_length_exceeded: the prompt and max_tokens over the "
        f"model's context), which a retry cannot fix: `batchrun retry-failed --job-dir {q} "
        "--max-model-len N` runs them with a longer context (N over 16, up to what the model "
        "takes), or shorten them (the prompt, or max_tokens) in the input file, then "
        f"`batchrun resume --job-dir {q} --force` takes the file and `batchrun retry-failed "
        f"--job-dir {q}` runs them."
    )
    shown = cli("status", "--job-dir", str(job), env=WIDE)
    assert row(shown.stdout, "failed") == row(r.stdout, "failed")
    assert status_json(job)["errors"]["failed_by_code"] == {"context_length_exceeded": 5}
    assert status_json(job)["retry_cannot_fix"] == {"context_length_exceeded": 5}

    # What the advice does not say to do, done: a retry as it is fails them the same way.
    again = rerun("retry-failed", job, env=WIDE)
    assert again.returncode == 1
    assert (
        row(again.stdout, "failed")
        == "5 (a retry cannot fix 5: context_length_exceeded 5 needs a longer --max-model-len or a shorter input)"
    )
    assert last_line(again) == said  # and the advice stays what can fix them

    export, longer, _, _ = advised(said)  # then the input way: the test below
    assert longer[:2] == ["retry-failed", "--job-dir"] and longer[-2:] == ["--max-model-len", "N"]
    fixed = follow(longer, "--no-progress", env=WIDE, N="64")
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert row(fixed.stdout, "failed") == "0"
    assert status_json(job)["requests"]["succeeded"] == 8
    (done,) = advised(last_line(fixed))
    assert done == export
    assert follow(done).returncode == 0
    assert len(read_jsonl(job / "output.jsonl")) == 8 and read_jsonl(job / "errors.jsonl") == []


def test_requests_over_the_context_shortened_in_the_input_run_as_advised(tmp_path: Path) -> None:
    """The advice's other way: the lines shortened in the file, the two commands it names."""
    src = write_jsonl(tmp_path / "in.jsonl", long_and_short(2, 1))
    job = tmp_path / "job"
    r = submit_echo(src, job, "--max-model-len", "16")
    assert r.returncode == 1, r.stderr
    _, _, force, retry = advised(last_line(r))
    # The same requests (custom_ids), shortened in place.
    write_jsonl(src, [chat_line(f"long{i}", "shorter now", max_tokens=4) for i in range(2)]
                + long_and_short(0, 1))  # fmt: skip
    taken = follow(force, "--no-progress")
    assert taken.returncode == 1, taken.stderr  # nothing run yet: the two still failed
    ran = follow(retry, "--no-progress")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert status_json(job)["requests"] | {"total": 3} == {
        "total": 3, "valid": 3, "succeeded": 3, "failed": 0, "invalid": 0, "pending": 0
    }  # fmt: skip
    answers = [r["body"] for r in journal_records(job) if r["kind"] == "result" and r["ok"]]
    assert sum("shorter now" in json.dumps(b) for b in answers) == 2


def _embedding(cid: str, dimensions: int) -> dict[str, Any]:
    return {
        "custom_id": cid,
        "method": "POST",
        "url": "/v1/embeddings",
        "body": {"model": "m", "input": "some text", "dimensions": dimensions},
    }


def test_what_the_engine_refuses_as_written_is_fixed_in_the_input_as_advised(
    tmp_path: Path,
) -> None:
    """A 400 from the engine (dimensions its model cannot give): never advised for a retry;
    fixed in the input and run by the commands the advice names."""
    src = write_jsonl(tmp_path / "in.jsonl", [_embedding("e0", 8), _embedding("e1", 5000)])
    job = tmp_path / "job"
    r = submit_echo(src, job, env=WIDE)
    assert r.returncode == 1, r.stderr
    assert (
        row(r.stdout, "failed")
        == "1 (a retry cannot fix 1: invalid_request 1 needs a change in the input)"
    )
    said = last_line(r)
    assert said == (
        f"1 request failed: see it with `batchrun export --job-dir {job}` (errors.jsonl). 1 was "
        "refused by the engine for what it holds (invalid_request: errors.jsonl says why), "
        "which a retry cannot fix: fix it in the input file, then "
        f"`batchrun resume --job-dir {job} --force` takes the file and "
        f"`batchrun retry-failed --job-dir {job}` runs it."
    )
    _, force, retry = advised(said)
    write_jsonl(src, [_embedding("e0", 8), _embedding("e1", 16)])
    assert follow(force, "--no-progress").returncode == 1
    ran = follow(retry, "--no-progress")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    (last,) = [x for x in journal_records(job) if x.get("custom_id") == "e1" and x["ok"]]
    assert len(last["body"]["data"]) == 1


def test_failures_a_retry_may_fix_are_advised_for_retry_failed_beside_the_others(
    tmp_path: Path,
) -> None:
    """One engine error among two requests over the context: retry-failed is advised for the
    one; followed (the engine well again), it is answered and the two are left as they were."""
    src = write_jsonl(tmp_path / "in.jsonl", [*long_and_short(2, 0), chat_line("flaky", "hi")])
    job = tmp_path / "job"
    fault = {"BATCHRUN_ECHO_FAIL": "flaky", **WIDE}
    r = submit_echo(src, job, "--max-model-len", "16", env=fault)
    assert r.returncode == 1, r.stderr
    said = last_line(r)
    assert said.startswith(
        f"3 requests failed: see them with `batchrun export --job-dir {job}` (errors.jsonl). "
        f"1 may succeed if run again: `batchrun retry-failed --job-dir {job}`. 2 are longer "
    ), said
    retry = advised(said)[1]
    ran = follow(retry, "--no-progress", env=WIDE)
    assert ran.returncode == 1
    assert (
        row(ran.stdout, "failed")
        == "2 (a retry cannot fix 2: context_length_exceeded 2 needs a longer --max-model-len or a shorter input)"
    )
    assert "may succeed if run again" not in last_line(ran)
    assert status_json(job)["requests"]["succeeded"] == 1
    assert status_json(job)["retry_cannot_fix"] == {"context_length_exceeded": 2}


def test_pending_requests_are_run_by_the_advised_resume_and_exported_as_advised(
    tmp_path: Path,
) -> None:
    src = chat_input(tmp_path / "in.jsonl", 3, "hi")
    job = tmp_path / "my job"
    assert submit_echo(src, job).returncode == 0
    # As after a kill: the last request's result never journaled.
    write_jsonl(job / "journal.jsonl", [x for x in journal_records(job) if x["custom_id"] != "r2"])
    r = rerun("retry-failed", job)
    (resume,) = advised(last_line(r))
    assert resume == ["resume", "--job-dir", str(job)]
    ran = follow(resume, "--no-progress")
    assert ran.returncode == 0, ran.stderr
    assert status_json(job)["requests"]["succeeded"] == 3
    (export,) = advised(last_line(ran))
    assert follow(export).returncode == 0
    assert [o["custom_id"] for o in read_jsonl(job / "output.jsonl")] == ["r0", "r1", "r2"]


def test_tune_s_advice_runs_the_rest_at_the_size_found(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", [chat_line(f"r{i}", "hi") for i in range(40)])
    job = tmp_path / "job"
    r = cli("tune", str(src), "--job-dir", str(job), *ECHO, "--max-batch-size", "16")
    assert r.returncode == 0, r.stderr
    size = json.loads((job / "manifest.json").read_text())["batch_size"]
    (resume,) = advised(last_line(r))
    ran = follow(resume, "--no-progress")
    assert ran.returncode == 0, ran.stderr
    assert status_json(job)["requests"]["succeeded"] == 40
    assert json.loads((job / "manifest.json").read_text())["batch_size"] == size


def test_a_second_submit_s_advice_continues_the_job(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", [chat_line(f"r{i}", "hi") for i in range(3)])
    job = tmp_path / "job"
    assert submit_echo(src, job).returncode == 0
    write_jsonl(job / "journal.jsonl", [x for x in journal_records(job) if x["custom_id"] != "r1"])
    r = submit_echo(src, job)
    assert r.returncode == 1
    (resume,) = advised(r.stderr)
    ran = follow(resume, "--no-progress")
    assert ran.returncode == 0, ran.stderr
    assert sorted(x["custom_id"] for x in journal_records(job)) == ["r0", "r1", "r2"]


def test_export_s_refusal_names_two_ways_and_both_work(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", [chat_line(f"r{i}", "hi") for i in range(3)])
    job = tmp_path / "job"
    assert submit_echo(src, job).returncode == 0
    write_jsonl(job / "journal.jsonl", [x for x in journal_records(job) if x["custom_id"] != "r0"])
    r = cli("export", "--job-dir", str(job))
    assert r.returncode == 1
    (resume,) = advised(r.stderr)
    assert r.stderr.rstrip().endswith("or pass --partial to export only what is finished")
    partial = cli("export", "--job-dir", str(job), "--partial")
    assert partial.returncode == 0 and len(read_jsonl(job / "output.jsonl")) == 2
    assert follow(resume, "--no-progress").returncode == 0
    assert cli("export", "--job-dir", str(job)).returncode == 0
    assert len(read_jsonl(job / "output.jsonl")) == 3


@pytest.mark.slow
@pytest.mark.parametrize("signals", [1, 2], ids=["ctrl-c", "ctrl-c-twice"])
def test_ctrl_c_s_advice_continues_the_job_and_answers_each_request_once(
    tmp_path: Path, signals: int
) -> None:
    """A real process stopped with SIGINT (a graceful stop), or two (stopped at once); the
    command it prints, run as printed."""
    src = write_jsonl(tmp_path / "in.jsonl", [chat_line(f"r{i}", "hi") for i in range(60)])
    job = tmp_path / "my job"
    # Twice: an engine that stops answering after 8 results, so that the graceful stop the
    # first SIGINT starts (the worker asked to stop, then waited for) is still on at the second.
    fault = {"BATCHRUN_ECHO_HANG_AFTER": "8"} if signals == 2 else {}
    p = start_echo(src, job, "--batch-size", "4", env={"BATCHRUN_ECHO_DELAY_MS": "100", **fault})
    try:
        wait_until(results_at_least(job, 8), "the job journaled 8 results", timeout=120)
        os.killpg(p.pid, signal.SIGINT)
        if signals == 2:
            time.sleep(0.5)
            os.kill(p.pid, signal.SIGINT)
        _, stderr = p.communicate(timeout=60)
    finally:
        kill_group(p)
    assert p.returncode == 130, stderr
    said = stderr.strip().splitlines()[-1]
    assert said.startswith("stopped at once;" if signals == 2 else "interrupted:"), stderr
    (resume,) = advised(said)
    ran = follow(resume, "--no-progress")
    assert ran.returncode == 0, ran.stderr
    ids = [x["custom_id"] for x in journal_records(job)]
    assert sorted(ids) == sorted(f"r{i}" for i in range(60))  # each once


@pytest.mark.slow
@pytest.mark.parametrize(
    ("stop", "pending"),
    [(signal.SIGINT, False), (signal.SIGTERM, False), (signal.SIGINT, True)],
    ids=["ctrl-c", "sigterm", "ctrl-c-with-pending"],
)
def test_a_stopped_retry_failed_s_advice_runs_what_it_left_failed(
    tmp_path: Path, stop: signal.Signals, pending: bool
) -> None:
    """retry-failed stopped mid-pass leaves failures that resume does not run (it runs requests
    with no finished attempt): the advice names retry-failed for them, after resume for the
    requests not run yet; followed as printed, every request is answered."""
    ids = [f"r{i}" for i in range(60)]
    src = write_jsonl(tmp_path / "in.jsonl", [chat_line(i, "hi") for i in ids])
    job = tmp_path / "my job"
    failing = {"BATCHRUN_ECHO_FAIL": ",".join(ids[::2])}
    assert submit_echo(src, job, "--max-attempts", "1", env=failing).returncode == 1
    if pending:  # as after a kill: two answers never journaled
        kept = [x for x in journal_records(job) if x["custom_id"] not in ("r1", "r3")]
        write_jsonl(job / "journal.jsonl", kept)
    before = len(journal_records(job))
    p = start_cli(
        "retry-failed", "--job-dir", str(job), "--no-progress", "--batch-size", "2",
        env={"BATCHRUN_ECHO_DELAY_MS": "100"},
    )  # fmt: skip
    try:
        wait_until(results_at_least(job, before + 4), "4 failures retried", timeout=120)
        os.killpg(p.pid, stop)
        _, stderr = p.communicate(timeout=60)
    finally:
        kill_group(p)
    assert p.returncode == (143 if stop == signal.SIGTERM else 130), stderr
    said = stderr.strip().splitlines()[-1]
    commands = advised(said)
    assert [c[0] for c in commands] == (["resume"] if pending else []) + ["retry-failed"], said
    assert status_json(job)["requests"]["failed"] > 0  # the pass was stopped with some left
    for command in commands:
        ran = follow(command, "--no-progress")
    assert ran.returncode == 0, ran.stderr
    assert status_json(job)["requests"]["succeeded"] == 60


@pytest.mark.parametrize("command", ["submit", "retry-failed"])
def test_an_engine_that_cannot_start_s_advice_continues_the_job_once_the_cause_is_fixed(
    tmp_path: Path, command: str
) -> None:
    """The engine fails its three starts: the one error line ends with the command that goes
    on (retry-failed for failures a retry-failed left), which, followed once the engine starts
    again, answers every request."""
    ids = [f"r{i}" for i in range(6)]
    src = write_jsonl(tmp_path / "in.jsonl", [chat_line(i, "hi") for i in ids])
    job = tmp_path / "my job"
    broken = {"BATCHRUN_ECHO_START_ERROR": "NCCL error boom", "BATCHRUN_START_RETRY_DELAY_S": "0"}
    if command == "submit":
        r = submit_echo(src, job, env=broken)
    else:
        failing = {"BATCHRUN_ECHO_FAIL": ",".join(ids[::2])}
        assert submit_echo(src, job, "--max-attempts", "1", env=failing).returncode == 1
        r = rerun("retry-failed", job, env=broken)
    assert r.returncode == 1, r.stderr
    said = error_line(r.stderr)
    assert said.startswith(
        "error: the engine failed to start 3 times in a row: RuntimeError: NCCL error boom. "
        "Everything finished so far is saved; once the cause is fixed, continue with: "
    ), said
    (then,) = advised(said)
    assert then[0] == ("resume" if command == "submit" else "retry-failed"), said
    ran = follow(then, "--no-progress")
    assert ran.returncode == 0, ran.stderr
    assert status_json(job)["requests"]["succeeded"] == 6


@pytest.mark.slow
def test_a_broken_engine_s_advice_runs_the_rest_and_then_the_crashed_ones(tmp_path: Path) -> None:
    """Three requests in a row crash the engine on their own: the run gives up, naming resume
    for the rest and retry-failed for those three once the engine is fixed; followed (no fault
    now), every request is answered."""
    ids = [f"r{i}" for i in range(12)]
    src = write_jsonl(tmp_path / "in.jsonl", [chat_line(i, "hi") for i in ids])
    job = tmp_path / "job"
    r = submit_echo(src, job, "--batch-size", "1", env={"BATCHRUN_ECHO_CRASH_ON": ",".join(ids)})
    assert r.returncode == 1
    assert "so the engine itself looks broken" in r.stderr, r.stderr
    resume, retry = advised(r.stderr)
    crashed = {x["custom_id"] for x in journal_records(job) if not x["ok"]}
    assert len(crashed) == 3
    rest = follow(resume, "--no-progress")
    assert rest.returncode == 1, rest.stderr  # the three crashed ones are still failed
    assert status_json(job)["requests"] | {"total": 0} == {
        "total": 0, "valid": 12, "succeeded": 9, "failed": 3, "invalid": 0, "pending": 0
    }  # fmt: skip
    again = follow(retry, "--no-progress")
    assert again.returncode == 0, again.stderr
    answered = {x["custom_id"] for x in journal_records(job) if x["ok"]}
    assert answered == set(ids) and crashed <= answered


def test_a_lost_input_map_is_written_again_by_the_advised_forced_resume(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", [chat_line(f"r{i}", "hi") for i in range(3)])
    job = tmp_path / "job"
    assert submit_echo(src, job).returncode == 0
    write_jsonl(src, [chat_line(f"r{i}", "hi") for i in range(4)])  # one more line
    assert rerun("resume", job, "--force").returncode == 0
    (input_map,) = job.glob("input-map-*.jsonl")
    input_map.unlink()
    r = rerun("resume", job)
    assert r.returncode == 1 and r.stderr.startswith("error: cannot read the job's input map")
    (force,) = advised(r.stderr)
    ran = follow(force, "--no-progress")
    assert ran.returncode == 0, ran.stderr
    assert status_json(job)["requests"]["succeeded"] == 4
    assert rerun("resume", job).returncode == 0


def test_failures_a_retry_cannot_fix_are_counted_from_failed_attempts_alone() -> None:
    """From the tally of failed attempts by code (never invalid lines, which share codes), in
    AS_WRITTEN's order, at most the failed requests (a request sent again by hand counts each
    attempt)."""
    from batchrun.job.lasting import lasting_failures

    errors = {
        "by_code": {"invalid_request": {"count": 9}},  # 8 of them invalid lines
        "failed_by_code": {"engine_error": 4, "invalid_request": 1, "context_length_exceeded": 6},
    }
    assert lasting_failures(errors, 10).by_code == {
        "context_length_exceeded": 6,
        "invalid_request": 1,
    }
    capped = lasting_failures(errors, 5)
    assert (capped.by_code, capped.too_long, capped.refused) == (
        {"context_length_exceeded": 5},
        5,
        0,
    )
    assert lasting_failures(None, 3).count == lasting_failures({"by_code": {}}, 3).count == 0
