"""One truth for every number (job/figures.py): status, the end-of-run summary, the report page
and the journal agree, through kill -9 and resume, with duplicates and the answer cache; values
that are no number are refused."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from support.cli import cli
from support.jobs import ECHO, journal_records, start_echo, status_json, submit_echo
from support.lines import chat_input, chat_line, write_jsonl
from support.waits import results_at_least, wait_until

from batchrun.job.run_clock import INTERVAL_S


def report_data(job: Path) -> dict[str, Any]:
    """The page's embedded data, as a script would read it."""
    r = cli("report", "--job-dir", str(job))
    assert r.returncode == 0, r.stderr
    page = (job / "report.html").read_text(encoding="utf-8")
    found = re.search(
        r'<script type="application/json" id="report-data">(.*?)</script>', page, re.S
    )
    assert found is not None
    return json.loads(found.group(1))  # type: ignore[no-any-return]


def journal_counts(job: Path, valid: int) -> dict[str, int]:
    """The request counts read straight from the journal: each request's last record."""
    last: dict[str, bool] = {}
    invalid = 0
    for rec in journal_records(job):
        if rec["kind"] == "invalid":
            invalid += 1
        else:
            last[rec["custom_id"]] = bool(rec["ok"])
    ok = sum(last.values())
    return {
        "total": valid + invalid,
        "valid": valid,
        "succeeded": ok,
        "failed": len(last) - ok,
        "invalid": invalid,
        "pending": valid - len(last),
    }


@pytest.mark.slow
def test_a_killed_job_s_status_page_and_journal_agree_and_its_wall_time_is_kept(
    tmp_path: Path,
) -> None:
    lines: list[Any] = [chat_line(f"r{i}", f"question {i}") for i in range(600)]
    lines.insert(7, "{not json")
    src = write_jsonl(tmp_path / "in.jsonl", lines)
    job = tmp_path / "job"
    started = time.monotonic()
    p = start_echo(
        src,
        job,
        "--batch-size",
        "8",
        "--gpu-hour-cost",
        "3600",
        env={"BATCHRUN_ECHO_DELAY_MS": "300", "BATCHRUN_ECHO_FAIL": "r3,r5"},
    )
    wait_until(results_at_least(job, 40), "the job journaled 40 results", timeout=120)
    # Past a few of the run clock's ticks: the kill may cost at most the last one.
    time.sleep(3 * INTERVAL_S)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    lived = time.monotonic() - started

    status = status_json(job)
    data = report_data(job)
    expected = journal_counts(job, 600)
    assert 0 < expected["pending"] < 600 and expected["invalid"] == 1
    assert expected["failed"] == 2  # r3 and r5, whose retries never ran
    assert status["status"] == "interrupted"
    assert status["requests"] == expected
    assert data["counts"] == expected
    records = [r for r in journal_records(job) if r["kind"] == "result"]
    assert status["attempts"] == data["attempts"] == len(records)
    assert status["errors"]["attempts"] == len(records)
    # The killed run's time: all but the clock's last interval (and the process's start-up).
    run_wall = status["wall_s"]
    assert lived - 2 * INTERVAL_S - 3 < run_wall <= lived
    assert data["wall_s"] == run_wall
    assert status["cost"]["usd"] == pytest.approx(run_wall, abs=1e-3)  # $1 a second
    assert data["cost"] == status["cost"]
    # The page's time axis starts at the run's start, never before.
    assert min(data["throughput"]["x"]) >= 0

    # The resume settles the killed run into the manifest, and the job's time covers both.
    r = cli("resume", "--job-dir", str(job), *ECHO[2:], env={"BATCHRUN_ECHO_DELAY_MS": "1"})
    # r3 and r5 are retried (their failures were retryable) and succeed: no fault is set now.
    assert r.returncode == 1, r.stderr  # the invalid line
    runs = json.loads((job / "manifest.json").read_text())["runs"]
    assert [run["status"] for run in runs] == ["killed", "completed"]
    assert runs[0]["wall_s"] == pytest.approx(run_wall, abs=1e-3)
    after = status_json(job)
    assert after["runs"] == 2
    assert after["wall_s"] == pytest.approx(run_wall + runs[1]["wall_s"], abs=2e-3)
    # The resume had no --gpu-hour-cost: it is priced at the job's latest rate.
    assert after["cost"]["usd"] == pytest.approx(after["wall_s"], abs=2e-3)
    assert after["requests"] == journal_counts(job, 600)
    assert f"2 ({after['wall_s']:,.1f}s in all)" in r.stdout


def test_cache_hits_and_attempts_agree_in_the_summary_status_and_page(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    # Deterministic lines (temperature 0) are cached; ten of them twice (duplicates).
    first = [chat_line(f"a{i}", f"q {i}", temperature=0) for i in range(20)]
    src1 = write_jsonl(tmp_path / "one.jsonl", first)
    r = submit_echo(src1, tmp_path / "j1", "--cache-dir", str(cache))
    assert r.returncode == 0, r.stderr
    # 20 lines the cache answers, 10 new ones, 10 duplicates of the new ones.
    second = [chat_line(f"b{i}", f"q {i}", temperature=0) for i in range(20)]
    second += [chat_line(f"n{i}", f"new {i % 10}", temperature=0) for i in range(20)]
    src2 = write_jsonl(tmp_path / "two.jsonl", second)
    job = tmp_path / "j2"
    r = submit_echo(src2, job, "--cache-dir", str(cache))
    assert r.returncode == 0, r.stderr

    status = status_json(job)
    data = report_data(job)
    assert status["cache_hits"] == data["cache_hits"] == 20
    assert status["deduplicated"] == data["deduplicated"] == 10
    assert status["attempts"] == data["attempts"] == 40
    assert status["engine_attempts"] == data["engine_attempts"] == 10
    assert status["throughput"]["counts"] == "engine"
    # The end-of-run summary: the same figures, the engine's share of this run said.
    assert "40 attempts in" in r.stdout and "(10 by the engine)" in r.stdout
    assert "20 answers from the cache" in r.stdout
    plain = cli("status", "--job-dir", str(job)).stdout
    assert "20 answers from the cache" in plain
    page = (job / "report.html").read_text(encoding="utf-8")
    assert "answers from the cache" in page and "40 (10 by the engine)" in page


def test_the_error_rate_counts_duplicates_copies_as_the_attempts_do(tmp_path: Path) -> None:
    # 24 lines: 12 distinct deterministic requests, each twice; 3 distinct ones fail (and so
    # do their copies): 6 of 24 attempts.
    lines = [chat_line(f"r{i}", f"q {i % 12}", temperature=0) for i in range(24)]
    src = write_jsonl(tmp_path / "in.jsonl", lines)
    job = tmp_path / "job"
    fail = ",".join(f"r{i}" for i in range(3))
    r = submit_echo(src, job, "--max-attempts", "1", env={"BATCHRUN_ECHO_FAIL": fail})
    assert r.returncode == 1, r.stderr
    status = status_json(job)
    assert status["requests"]["failed"] == 6 and status["deduplicated"] == 12
    assert status["errors"]["attempts"] == status["attempts"] == 24
    assert status["errors"]["rate"] == 0.25
    assert "25.00% of attempts and invalid lines" in r.stdout
    assert report_data(job)["errors_rate"] == 0.25


def test_the_error_rate_row_says_how_many_codes_it_leaves_out(tmp_path: Path) -> None:
    """Eight error codes: the row names the five most frequent, then how many more codes, with
    their failed attempts and invalid lines, which status --json lists."""
    kinds: list[tuple[int, Any]] = [
        (7, lambda i: f"{{not json {i}"),
        (6, lambda i: {**chat_line(f"m{i}", "hi"), "method": "GET"}),
        (5, lambda i: {**chat_line(f"u{i}", "hi"), "url": "/v1/nope"}),
        (4, lambda i: {**chat_line(f"b{i}", "hi"), "body": [i]}),
        (3, lambda i: chat_line(f"q{i}", "hi", temperature="hot")),
        (2, lambda i: {k: v for k, v in chat_line("", f"hi {i}").items() if k != "custom_id"}),
        (1, lambda i: {**chat_line("", "hi"), "custom_id": i}),
    ]
    lines = [chat_line("fails", "hi")] + [make(i) for n, make in kinds for i in range(n)]
    src = write_jsonl(tmp_path / "in.jsonl", lines)
    job = tmp_path / "job"
    env = {"BATCHRUN_ECHO_FAIL": "fails", "COLUMNS": "400"}
    r = submit_echo(src, job, "--max-attempts", "1", env=env)
    assert r.returncode == 1, r.stderr
    by_code = status_json(job)["errors"]["by_code"]
    assert {code: e["count"] for code, e in by_code.items()} == {
        "invalid_json": 7, "invalid_method": 6, "invalid_url": 5, "invalid_body": 4,
        "invalid_request": 3, "missing_custom_id": 2, "invalid_custom_id": 1, "engine_error": 1,
    }  # fmt: skip
    left_out = (
        ", and 3 more codes (1 failed attempt, 3 invalid lines): batchrun status --json lists them"
    )
    plain = cli("status", "--job-dir", str(job), env={"COLUMNS": "400"}).stdout
    for output in (r.stdout, plain):
        (row,) = [line for line in output.splitlines() if line.startswith("│ error rate ")]
        assert row.split("│")[2].strip().endswith(f"invalid_request 3 (10.34%){left_out}"), row


def test_a_duplicate_copied_again_in_each_retry_pass_is_one_request_deduplicated(
    tmp_path: Path,
) -> None:
    """Three deterministic questions, each asked three times (6 duplicates); the one whose
    representative fails copies its failure to its 2 duplicates in every pass (3 by default,
    then retry-failed's): still 6 requests answered from an identical one, in the summary,
    status and the page, while the attempts count every copy."""
    lines = [chat_line(f"{q}{i}", f"question {q}", temperature=0) for q in "abc" for i in range(3)]
    src = write_jsonl(tmp_path / "in.jsonl", lines)
    job = tmp_path / "job"
    r = submit_echo(src, job, env={"BATCHRUN_ECHO_FAIL": "a0", "COLUMNS": "200"})
    assert r.returncode == 1, r.stderr
    assert "│ deduplicated │ 6 requests answered from an identical one (" in r.stdout
    assert "15 attempts in" in r.stdout and "(5 by the engine)" in r.stdout
    status = status_json(job)
    assert status["deduplicated"] == report_data(job)["deduplicated"] == 6
    assert (status["attempts"], status["engine_attempts"]) == (15, 5)
    r = cli("retry-failed", "--job-dir", str(job), *ECHO[2:], env={"BATCHRUN_ECHO_FAIL": "a0"})
    assert "3 attempts in" in r.stdout and "(1 by the engine)" in r.stdout
    assert status_json(job)["deduplicated"] == 6


def test_a_short_job_s_page_draws_from_one_point_with_distinct_labels(tmp_path: Path) -> None:
    src = chat_input(tmp_path / "in.jsonl", 30, "q")
    job = tmp_path / "job"
    assert submit_echo(src, job).returncode == 0
    data = report_data(job)
    x = data["throughput"]["x"]
    assert x and min(x) >= 0 and sum(data["throughput"]["ok"]) == 30
    for key in ("latency", "queue"):
        labels = data[key]["labels"]
        assert labels and len(set(labels)) == len(labels), labels
    assert data["counts"]["succeeded"] == 30 and data["counts"]["pending"] == 0


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--gpu-hour-cost", "nan"),
        ("--gpu-hour-cost", "inf"),
        ("--request-timeout", "nan"),
        ("--stall-timeout", "nan"),
    ],
)
def test_values_that_are_no_number_are_refused(tmp_path: Path, option: str, value: str) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", [chat_line("a", "hi")])
    job = tmp_path / "job"
    r = submit_echo(src, job, option, value)
    assert r.returncode == 2
    assert "finite number" in r.stderr and option in r.stderr
    assert "Traceback" not in r.stderr
    assert not job.exists()
