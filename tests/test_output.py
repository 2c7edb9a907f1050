"""Output never stops a job: a closed stdout or stderr silences batchrun, the job runs to its end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from support.cli import cli
from support.jobs import echo_args
from support.lines import chat_input
from support.paths import ROOT


def test_a_closed_output_pipe_does_not_stop_the_job(tmp_path: Path) -> None:
    # As `batchrun submit big.jsonl 2>&1 | head -1`: the reader takes one line and goes away.
    src = chat_input(tmp_path / "in.jsonl", 3000)
    job = tmp_path / "job"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "batchrun",
            *echo_args(src, job, "--batch-size", "64", progress=True),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "BATCHRUN_ECHO_DELAY_MS": "5"},
        cwd=ROOT,
    )
    assert proc.stdout is not None
    first = proc.stdout.readline()
    assert first.startswith(b"job dir:")
    proc.stdout.close()  # every later write by batchrun meets a closed pipe
    assert proc.wait(timeout=300) == 0
    status = json.loads(cli("status", "--job-dir", str(job), "--json").stdout)
    assert status["status"] == "completed"
    assert status["requests"]["succeeded"] == 3000
