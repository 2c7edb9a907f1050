"""What the Python API's tests share: request lists, and the process-wide state an in-process
run leaves behind put back, as a CLI process's exit would (conftest.run_cli does the same for
the CLI run in process)."""

from __future__ import annotations

import multiprocessing
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support.cli import kill_new_workers
from support.jobs import journal_records
from support.lines import chat_line


def chat_requests(count: int, prefix: str = "r") -> list[dict[str, Any]]:
    """`count` short chat requests, custom_ids `<prefix>0`, `<prefix>1`, ..."""
    return [chat_line(f"{prefix}{i}", f"say {i}", max_tokens=4) for i in range(count)]


def answered(job: Path) -> Counter[str]:
    """How many successful results the journal holds per custom_id (exactly once: all 1)."""
    return Counter(
        r["custom_id"] for r in journal_records(job) if r["kind"] == "result" and r["ok"]
    )


def input_lines(job: Path) -> list[str]:
    """The job's input file (requests.jsonl), line by line."""
    return (job / "requests.jsonl").read_text(encoding="utf-8").splitlines()


@pytest.fixture
def api_process() -> Iterator[None]:
    """Put back what an in-process run changes for the whole process: the media policy of the
    job it read; and end the worker processes it left, as a process's exit would."""
    from batchrun.openai import media
    from batchrun.workers import process

    policy = media._policy
    groups, children = set(process._GROUPS), set(multiprocessing.active_children())
    yield
    media._policy = policy
    kill_new_workers(groups, children)
