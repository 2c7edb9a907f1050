"""The remote engine end to end on a fake OpenAI server in the test's process (tests/support/fakes/
openai_server.py): lines through `submit --base-url`, the server checked before any job exists,
faults waited out or answered, the base URL kept by the job, the key never written."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from support.cli import cli, start_cli
from support.fakes.openai_server import MODEL, answer, chat_body_line, fake_openai_server
from support.jobs import journal_records, rerun
from support.processes import kill_9_after

from batchrun.job.paths import command

KEY = "sk-test-secret-4711"


def _input(tmp_path: Path, n: int, **body: object) -> Path:
    path = tmp_path / "in.jsonl"
    path.write_text(
        "".join(chat_body_line(f"r{i}", f"line {i} text", **body) + "\n" for i in range(n))
    )
    return path


def _submit(src: Path, job: Path, url: str, *more: str) -> tuple[int, str, str]:
    r = cli("submit", str(src), "--job-dir", str(job), "--base-url", url, "--no-progress", *more)
    return r.returncode, r.stdout, r.stderr


def _errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def _last_records(job: Path) -> dict[str, dict[str, object]]:
    return {r["custom_id"]: r for r in journal_records(job) if r["kind"] == "result"}


def test_a_batch_goes_through_a_server_and_the_job_keeps_its_url(tmp_path: Path) -> None:
    src, job = _input(tmp_path, 12, max_tokens=5), tmp_path / "job"
    with fake_openai_server() as server:
        code, _, err = _submit(src, job, server.url, "--api-key", KEY)
        assert code == 0, err
        # Each line's body as given, with the server's one model filled in.
        assert sorted(b["messages"][0]["content"] for _, b in server.received) == sorted(
            f"line {i} text" for i in range(12)
        )
        assert all(b["model"] == MODEL and "priority" not in b for _, b in server.received)
    records = _last_records(job)
    assert len(journal_records(job)) == 12 and all(r["ok"] for r in records.values())
    body = {"model": MODEL, "messages": [{"role": "user", "content": "line 3 text"}]}
    assert records["r3"]["body"] == answer("/v1/chat/completions", {**body, "max_tokens": 5})
    manifest = json.loads((job / "manifest.json").read_text())
    assert manifest["engine"]["engine"] == "remote"
    assert manifest["engine"]["base_url"] == server.url
    assert manifest["model"] == MODEL
    assert manifest["batch_size_source"] == "flow control"
    assert f"server {server.url}: serves {MODEL}" in err
    # The key is sent, never kept.
    for path in job.rglob("*"):
        if path.is_file():
            assert KEY not in path.read_text(errors="replace"), path


def test_status_and_resume_need_no_base_url_and_a_new_one_is_recorded(tmp_path: Path) -> None:
    src, job = _input(tmp_path, 4), tmp_path / "job"
    with fake_openai_server() as first:
        first.faults.extend(["500"] * 4)
        code, _, err = _submit(src, job, first.url, "--max-attempts", "1", "--order", "input")
        assert code == 1, err
        assert len(first.received) == 4
    # status reads the job alone: the server is gone.
    r = cli("status", "--job-dir", str(job), "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["batch_size_source"] == "flow control"
    with fake_openai_server() as second:
        r = rerun("retry-failed", job, "--base-url", second.url)
        assert r.returncode == 0, r.stderr
        assert f"overrides: --base-url {second.url} (was {first.url})" in r.stderr
        assert len(second.received) == 4
        r = rerun("resume", job)  # done: nothing sent
        assert r.returncode == 0, r.stderr
        assert len(second.received) == 4
    manifest = json.loads((job / "manifest.json").read_text())
    assert manifest["engine"]["base_url"] == second.url
    assert manifest["overrides"][-1]["options"] == {
        "base_url": {"old": first.url, "new": second.url}
    }


def test_throttling_drops_and_restarts_are_waited_out_not_failures(tmp_path: Path) -> None:
    src, job = _input(tmp_path, 20), tmp_path / "job"
    with fake_openai_server(delay_s=0.02) as server:
        server.faults.extend(["429:0.2", "503", "drop", "502", "503", "drop"])
        code, _, err = _submit(src, job, server.url)
        assert code == 0, err
        assert len(server.received) == 26  # every fault sent again
    records = journal_records(job)
    assert len(records) == 20 and all(r["ok"] and r["attempt"] == 1 for r in records)


def test_a_client_error_is_the_line_s_answer_and_a_server_error_is_retried(
    tmp_path: Path,
) -> None:
    src, job = tmp_path / "in.jsonl", tmp_path / "job"
    lines = [chat_body_line("ok", "fine"), chat_body_line("other", "x", model="no-such")]
    src.write_text("\n".join(lines) + "\n")
    with fake_openai_server() as server:
        server.faults.append("500")
        code, _, err = _submit(src, job, server.url, "--order", "input")
        assert code == 1, err
    by_id: dict[str, list[dict[str, object]]] = {}
    for r in journal_records(job):
        by_id.setdefault(str(r["custom_id"]), []).append(r)
    # The 500 was a failed attempt, run again by the retry pass.
    assert [(r["ok"], r["status_code"]) for r in by_id["ok"]] == [(False, 500), (True, 200)]
    # The unknown model is the line's answer, at once and once.
    [unknown] = by_id["other"]
    assert (unknown["ok"], unknown["status_code"], unknown["retryable"]) == (False, 404, False)
    assert unknown["error"] == {
        "code": "NotFoundError",
        "message": "The model `no-such` does not exist.",
    }


def test_priority_is_sent_and_max_concurrency_caps_what_is_in_flight(tmp_path: Path) -> None:
    src, job = _input(tmp_path, 30), tmp_path / "job"
    with fake_openai_server(delay_s=0.05) as server:
        code, _, err = _submit(src, job, server.url, "--priority", "-3", "--max-concurrency", "4")
        assert code == 0, err
        assert {b["priority"] for _, b in server.received} == {-3}
        assert server.peak_in_flight <= 4
    manifest = json.loads((job / "manifest.json").read_text())
    assert manifest["engine"]["max_concurrency"] == 4
    assert 1 <= manifest["batch_size"] <= 4


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--base-url", "ftp://h/v1"],
            "Invalid value for '--base-url' (env var: 'BATCHRUN_BASE_URL'): must be an http:// "
            "or https:// URL such as http://HOST:8000/v1, got 'ftp://h/v1'",
        ),
        (
            ["--base-url", "localhost:8000"],
            "Invalid value for '--base-url' (env var: 'BATCHRUN_BASE_URL'): must be an http:// "
            "or https:// URL such as http://HOST:8000/v1, got 'localhost:8000'",
        ),
        (
            ["--base-url", "http://h/v1", "--engine", "echo"],
            "Invalid value for '--base-url' / '--engine': --base-url sends the lines to a server "
            "(the remote engine), but --engine is echo; leave --engine out",
        ),
        (
            ["--engine", "remote"],
            "Invalid value for '--base-url': is needed by the remote engine: the server's URL, "
            "e.g. http://HOST:8000/v1",
        ),
    ],
)
def test_a_bad_base_url_is_a_usage_error_and_makes_no_job(
    tmp_path: Path, args: list[str], message: str
) -> None:
    src, job = _input(tmp_path, 2), tmp_path / "job"
    r = cli("submit", str(src), "--job-dir", str(job), *args, env={"COLUMNS": "1000"})
    assert r.returncode == 2
    assert message in " ".join(r.stderr.split()), r.stderr
    assert not job.exists()


def test_a_server_that_cannot_be_used_is_one_line_and_no_job(tmp_path: Path) -> None:
    src, job = _input(tmp_path, 2), tmp_path / "job"
    with fake_openai_server() as server:
        url = server.url
    # Down (its port closed).
    code, _, err = _submit(src, job, url)
    assert code == 1 and not job.exists()
    assert _errors(err) == [
        f"error: cannot reach the server at {url} ([Errno 111] Connection refused); is it "
        "running, and is --base-url right?"
    ]
    with fake_openai_server(key=KEY) as server:
        code, _, err = _submit(src, job, server.url, "--api-key", "sk-wrong")
        assert code == 1 and not job.exists()
        assert _errors(err) == [
            f"error: the server at {server.url} refused the key given (HTTP 401: bad key); "
            "pass --api-key or set OPENAI_API_KEY"
        ]
        assert server.received == []
    with fake_openai_server(broken_models=True) as server:
        code, _, err = _submit(src, job, server.url)
        assert code == 1 and not job.exists()
        assert _errors(err) == [
            f"error: the server at {server.url} does not answer as an OpenAI-compatible server: "
            f"GET {server.url}/models gave '<html>hello</html>', not a model list"
        ]
    with fake_openai_server(models=["a", "b"]) as server:
        code, _, err = _submit(src, job, server.url, "--served-model-name", "c")
        assert code == 1 and not job.exists()
        assert _errors(err) == [
            f"error: the server at {server.url} does not serve the model 'c' (it serves a, b); "
            "fix --served-model-name"
        ]


def test_the_key_comes_from_openai_api_key_too(tmp_path: Path) -> None:
    src, job = _input(tmp_path, 3), tmp_path / "job"
    with fake_openai_server(key=KEY) as server:
        r = cli(
            "submit", str(src), "--job-dir", str(job), "--base-url", server.url, "--no-progress",
            env={"OPENAI_API_KEY": KEY},
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        assert len(server.received) == 3


@pytest.mark.slow
def test_a_refused_key_mid_job_stops_it_and_keeps_what_was_answered(tmp_path: Path) -> None:
    src, job = _input(tmp_path, 40), tmp_path / "job"
    with fake_openai_server(delay_s=0.01, key=KEY) as server:
        # The key is taken at start, then refused from the 10th line on (a key revoked).
        server.faults.extend([""] * 9 + ["401"] * 100)
        code, _, err = _submit(src, job, server.url, "--api-key", KEY, "--max-concurrency", "1")
        assert code == 1
        assert _errors(err) == [
            "error: the server refused the API key (HTTP 401: bad key); pass --api-key or set "
            "OPENAI_API_KEY, then resume the job. Everything finished so far is saved; once the "
            f"cause is fixed, continue with: {command('resume', job)}"
        ]
        answered = [r["custom_id"] for r in journal_records(job)]
        assert len(answered) == 9 and all(r["ok"] for r in journal_records(job))
        server.faults.clear()
        r = rerun("resume", job, "--api-key", KEY)
        assert r.returncode == 0, r.stderr
    counts = Counter(r["custom_id"] for r in journal_records(job))
    assert len(counts) == 40 and set(counts.values()) == {1}


@pytest.mark.slow
def test_kill_9_mid_job_then_resume_answers_every_line_exactly_once(tmp_path: Path) -> None:
    src, job = _input(tmp_path, 60), tmp_path / "job"
    with fake_openai_server(delay_s=0.2) as server:
        proc = start_cli(
            "submit", str(src), "--job-dir", str(job), "--base-url", server.url, "--no-progress",
            "--max-concurrency", "4",
        )  # fmt: skip
        kill_9_after(proc, job, 10)
        before = len(journal_records(job))
        assert before < 60
        server.delay_s = 0.0
        r = rerun("resume", job)
        assert r.returncode == 0, r.stderr
    counts = Counter(r["custom_id"] for r in journal_records(job))
    assert len(counts) == 60 and set(counts.values()) == {1}
    assert all(r["ok"] for r in journal_records(job))


def test_doctor_checks_a_server_and_names_the_fix() -> None:
    with fake_openai_server(key=KEY) as server:
        r = cli("doctor", "--base-url", server.url, "--api-key", KEY)
        assert r.returncode == 0, r.stderr
        assert r.stdout.splitlines() == [
            f"server: {server.url}",
            "API key: sent (--api-key or OPENAI_API_KEY)",
            f"models: {MODEL}",
            f"ok: a job with --base-url {server.url} would run; lines naming no model are sent "
            f"with {MODEL}",
        ]
        r = cli("doctor", "--base-url", server.url, "--json")
        assert r.returncode == 1
        found = json.loads(r.stdout)
        assert (found["ok"], found["key_sent"], found["models"]) == (False, False, [])
        assert found["problem"] == (
            f"the server at {server.url} refused no key (none was given) (HTTP 401: bad key); "
            "pass --api-key or set OPENAI_API_KEY"
        )


def test_tune_has_nothing_to_search_on_a_server(tmp_path: Path) -> None:
    src, job = _input(tmp_path, 2), tmp_path / "job"
    with fake_openai_server() as server:
        r = cli("tune", str(src), "--job-dir", str(job), "--base-url", server.url)
        assert server.received == []
    assert r.returncode == 2 and not job.exists()
    assert "has no batch size for tune to search" in r.stderr
