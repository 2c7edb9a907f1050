"""What a job prints while it runs: a bar on a terminal, plain progress lines in a log."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from batchrun.console.progress import ProgressReporter
from batchrun.openai.records import CHAT, Outcome, Request
from batchrun.openai.response_bodies import Choice, failure, success


def _outcomes(count: int, failed: int = 0) -> list[Outcome]:
    out = []
    for i in range(count):
        req = Request(f"r{i}", i + 1, CHAT, {"model": "m", "messages": []})
        if i < failed:
            out.append(
                failure(
                    req, "engine_error", "died", status_code=500, retryable=False, latency_s=0.1
                )
            )
        else:
            out.append(
                success(req, [Choice("hi", "stop", 4)], model="m", prompt_tokens=1, latency_s=0.1)
            )
    return out


def test_a_log_gets_plain_progress_lines_not_a_redrawn_bar(
    capsys: pytest.CaptureFixture[str],
) -> None:
    reporter = ProgressReporter(total=10, initial=2, tty=False, log_every_s=0.0)
    reporter.advance(_outcomes(3, failed=1))
    reporter.close()
    err = capsys.readouterr().err
    assert "\r" not in err and "|" not in err, repr(err)  # no bar, no carriage returns
    first = err.splitlines()[0]
    assert re.fullmatch(
        r"\[batchrun\] requests: 5/10 \(50\.0%\), [\d.,]+ req/s, [\d,]+ tok/s, 1 failed, "
        r"about \d+:\d\d left",
        first,
    ), first


def test_no_progress_means_no_progress_lines(capsys: pytest.CaptureFixture[str]) -> None:
    reporter = ProgressReporter(total=10, tty=False, enabled=False, log_every_s=0.0)
    reporter.advance(_outcomes(4))
    reporter.close()
    reporter.event("still said")
    assert capsys.readouterr().err == "[batchrun] still said\n"


def test_a_terminal_gets_the_bar_and_no_progress_lines(
    capsys: pytest.CaptureFixture[str],
) -> None:
    reporter = ProgressReporter(total=4, tty=True, log_every_s=0.0)
    reporter.advance(_outcomes(4))
    reporter.close()
    err = capsys.readouterr().err
    assert "4/4" in err and "[batchrun] requests:" not in err, repr(err)


def test_submit_with_stderr_to_a_file_writes_no_carriage_returns(tmp_path: Path) -> None:
    """A real run, its stderr a file as under nohup: events and the summary, no bar."""
    lines = [
        f'{{"custom_id": "r{i}", "method": "POST", "url": "/v1/chat/completions", '
        f'"body": {{"model": "m", "messages": [{{"role": "user", "content": "hi {i}"}}]}}}}'
        for i in range(20)
    ]
    echo_job = ["--job-dir", str(tmp_path / "job"), "--engine", "echo"]
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    with (tmp_path / "err.log").open("w") as err:
        run = subprocess.run(
            [sys.executable, "-m", "batchrun", "submit", str(tmp_path / "in.jsonl"), *echo_job],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            timeout=120,
        )
    log = (tmp_path / "err.log").read_text()
    assert run.returncode == 0, log
    assert "\r" not in log and "[batchrun]" in log, repr(log)
