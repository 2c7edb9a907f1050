"""An echo job as most tests run one, and what a job leaves in its directory."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from batchrun.job.shards import ShardReader, restore, shards_dir
from batchrun.job.vectors import VectorReader
from support.cli import cli, cli_process, start_cli
from support.lines import read_jsonl

# The options of every echo job a test runs: the echo engine, no progress bar.
ECHO = ("--engine", "echo", "--no-progress")


def echo_args(src: Path | str, job: Path | str, *extra: str, progress: bool = False) -> list[str]:
    """`submit SRC --job-dir JOB --engine echo --no-progress EXTRA...`: an echo job's command
    (`progress=True`: without --no-progress)."""
    echo = ECHO if not progress else ECHO[:2]
    return ["submit", str(src), "--job-dir", str(job), *echo, *extra]


def submit_echo(
    src: Path | str,
    job: Path | str,
    *extra: str,
    env: dict[str, str] | None = None,
    timeout: float = 600,
    process: bool = False,
    progress: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Run an echo job to its end (`cli`; `process=True`: `cli_process`, a real process)."""
    run = cli_process if process else cli
    return run(*echo_args(src, job, *extra, progress=progress), env=env, timeout=timeout)


def start_echo(
    src: Path | str,
    job: Path | str,
    *extra: str,
    env: dict[str, str] | None = None,
    progress: bool = False,
) -> subprocess.Popen[str]:
    """Start an echo job in a process of its own (`start_cli`), to signal or kill."""
    return start_cli(*echo_args(src, job, *extra, progress=progress), env=env)


def journal_records(job_dir: Path) -> list[dict[str, Any]]:
    """The job's journal records: its whole lines (one being written while a job runs is not
    one yet, as the journal's own reader says), their vectors in their bodies."""
    data = (job_dir / "journal.jsonl").read_bytes()
    whole = data[: data.rfind(b"\n") + 1]
    # Each line with its body back from its worker's shard and its vectors from the side file
    # (job/shards.py, job/vectors.py): the record as an earlier version wrote it, its
    # embeddings base64 in the body.
    with (
        VectorReader(job_dir / "journal.jsonl") as vectors,
        ShardReader(shards_dir(job_dir)) as shards,
    ):
        return [
            json.loads(restore(x + b"\n", vectors, shards)) for x in whole.split(b"\n") if x.strip()
        ]


def status_json(job: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    """`batchrun status --json` of a job, read (the test fails if the command does)."""
    r = cli("status", "--job-dir", str(job), "--json", env=env)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert isinstance(data, dict)
    return data


def exported(job: Path) -> list[dict[str, Any]]:
    """`batchrun export` of a job, then its output.jsonl's lines."""
    r = cli("export", "--job-dir", str(job))
    assert r.returncode == 0, r.stderr
    return read_jsonl(job / "output.jsonl")


def chat_answers(job: Path) -> dict[str, str]:
    """Each custom_id's chat answer in an exported job's output.jsonl."""
    return {
        o["custom_id"]: o["response"]["body"]["choices"][0]["message"]["content"]
        for o in read_jsonl(job / "output.jsonl")
    }


def answer_models(job: Path) -> dict[str, str]:
    """`batchrun export` of a job, then the model that answered each custom_id."""
    return {o["custom_id"]: o["response"]["body"]["model"] for o in exported(job)}


def rerun(
    command: str,
    job: Path | str,
    *extra: str,
    env: dict[str, str] | None = None,
    timeout: float = 600,
    process: bool = False,
) -> subprocess.CompletedProcess[str]:
    """`batchrun COMMAND --job-dir JOB --no-progress EXTRA...` to its end, COMMAND `resume` or
    `retry-failed` (`cli`; `process=True`: `cli_process`)."""
    run = cli_process if process else cli
    return run(command, "--job-dir", str(job), "--no-progress", *extra, env=env, timeout=timeout)
