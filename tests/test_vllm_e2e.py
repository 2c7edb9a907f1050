"""End to end on the real vLLM engine and the embedded default model (SmolLM2-135M-Instruct).

The engine starts once per job, and the jobs are module-scoped fixtures that several tests read:
one chat job (with bad lines mixed in), one completions job, and one job killed with SIGKILL in
the middle of `submit` and resumed.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from conftest import (
    ROOT,
    chat_line,
    cli,
    journal_records,
    read_jsonl,
    start_cli,
    worker_pids,
    write_jsonl,
)
from openai.types import Completion
from openai.types.chat import ChatCompletion

pytestmark = pytest.mark.vllm

LONG = "word " * 3000  # far more tokens than --max-model-len 1024 allows


@pytest.fixture(scope="module")
def chat_job(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A chat job with varied sampling fields, an invalid line and a prompt that is too long."""
    tmp = tmp_path_factory.mktemp("chat")
    lines: list[Any] = [
        chat_line("math", "What is 1 plus 1? Answer briefly.", max_tokens=16, temperature=0),
        chat_line(
            "capital",
            "What is the capital of France? One word.",
            max_completion_tokens=8,
            temperature=0,
        ),
        chat_line("two", "Say hello.", max_tokens=12, temperature=0.9, seed=7, n=2),
        chat_line(
            "stop",
            "Count from 1 to 20 separated by commas.",
            max_tokens=48,
            temperature=0,
            stop=["7"],
        ),
        chat_line("short", "Write a long story about a dragon.", max_tokens=3, temperature=0),
        '{"custom_id": "broken", "method": "POST"',
        chat_line("toolong", LONG, max_tokens=8),
        chat_line("topp", "Name a color.", max_tokens=8, temperature=0.5, top_p=0.9, seed=3),
        # The two lines that killed whole jobs: a lone surrogate escape (a truncated emoji, as
        # text scraped from the web carries; json.dumps writes it as the escape \ud83d) crashed
        # the tokenizer, and a seed beyond 64 bits crashed the sampler, in every worker.
        chat_line("sur", "truncated emoji \ud83d end", max_tokens=4),
        chat_line("bigseed", "Say hi.", max_tokens=4, seed=2**70),
    ]
    src = write_jsonl(tmp / "chat.jsonl", lines)
    job = tmp / "job"
    run = cli("submit", str(src), "--job-dir", str(job), "--max-model-len", "1024", "--no-progress")
    export = cli("export", "--job-dir", str(job))
    parquet = cli("export", "--job-dir", str(job), "--parquet")
    return {"job": job, "submit": run, "export": export, "parquet": parquet}


def _outputs(job: Path) -> dict[str, dict[str, Any]]:
    return {o["custom_id"]: o for o in read_jsonl(job / "output.jsonl")}


def test_chat_job_runs_and_reports_bad_lines(chat_job: dict[str, Any]) -> None:
    run = chat_job["submit"]
    assert run.returncode == 1, run.stderr[-3000:]  # 1: it finished, with failed lines
    assert "Traceback" not in run.stderr
    assert "batch size" in run.stderr  # the size it picked is shown
    assert chat_job["export"].returncode == 0
    outputs = _outputs(chat_job["job"])
    assert set(outputs) == {"math", "capital", "two", "stop", "short", "topp"}
    errors = {e["error"]["line"]: e for e in read_jsonl(chat_job["job"] / "errors.jsonl")}
    assert errors[6]["custom_id"] is None and errors[6]["error"]["code"] == "invalid_json"
    assert errors[7]["custom_id"] == "toolong"
    assert errors[7]["error"]["code"] == "context_length_exceeded"
    assert errors[7]["response"]["status_code"] == 400


def test_the_real_poison_lines_fail_alone_and_the_job_finishes(chat_job: dict[str, Any]) -> None:
    raw = (chat_job["job"].parent / "chat.jsonl").read_text(encoding="utf-8").splitlines()
    assert "\\ud83d" in raw[8] and "1180591620717411303424" in raw[9]  # as the file had
    run = chat_job["submit"]
    assert "error:" not in run.stderr, run.stderr[-3000:]
    status = json.loads(cli("status", "--job-dir", str(chat_job["job"]), "--json").stdout)
    assert status["status"] == "completed"
    assert status["requests"]["pending"] == 0
    errors = {e["custom_id"]: e for e in read_jsonl(chat_job["job"] / "errors.jsonl")}
    sur, seed = errors["sur"]["error"], errors["bigseed"]["error"]
    assert (sur["line"], seed["line"]) == (9, 10)
    # Caught by validation, each names its field; the engine never saw them.
    assert "body.messages[0].content" in sur["message"] and "surrogate" in sur["message"]
    assert "body.seed" in seed["message"]
    assert set(_outputs(chat_job["job"])) == {"math", "capital", "two", "stop", "short", "topp"}


def test_chat_bodies_parse_with_the_openai_types(chat_job: dict[str, Any]) -> None:
    for cid, line in _outputs(chat_job["job"]).items():
        assert line["response"]["status_code"] == 200 and line["error"] is None
        body = ChatCompletion.model_validate(line["response"]["body"])
        assert body.object == "chat.completion"
        assert body.model == "test-model", cid  # the name the request asked for
        assert body.usage is not None and body.usage.completion_tokens > 0
        assert all(c.message.role == "assistant" for c in body.choices)


def test_the_model_really_answers(chat_job: dict[str, Any]) -> None:
    outputs = _outputs(chat_job["job"])
    math = outputs["math"]["response"]["body"]["choices"][0]["message"]["content"]
    assert "2" in math
    capital = outputs["capital"]["response"]["body"]["choices"][0]["message"]["content"]
    assert "paris" in capital.lower()


def test_per_request_sampling_fields_reach_vllm(chat_job: dict[str, Any]) -> None:
    outputs = _outputs(chat_job["job"])
    two = outputs["two"]["response"]["body"]
    assert len(two["choices"]) == 2 and [c["index"] for c in two["choices"]] == [0, 1]
    short = outputs["short"]["response"]["body"]
    assert short["usage"]["completion_tokens"] == 3
    assert short["choices"][0]["finish_reason"] == "length"
    stop = outputs["stop"]["response"]["body"]["choices"][0]
    assert "7" not in stop["message"]["content"] and stop["finish_reason"] == "stop"
    capital = outputs["capital"]["response"]["body"]
    assert capital["usage"]["completion_tokens"] <= 8


def test_chat_parquet_is_readable_by_pandas(chat_job: dict[str, Any]) -> None:
    assert chat_job["parquet"].returncode == 0
    df = pd.read_parquet(chat_job["job"] / "results.parquet")
    assert len(df) == 8
    assert list(df["line"]) == [1, 2, 3, 4, 5, 6, 7, 8]
    by_id = df.set_index("line")
    assert by_id.loc[1, "status"] == "succeeded" and "2" in by_id.loc[1, "content"]
    assert by_id.loc[6, "status"] == "invalid"
    assert by_id.loc[7, "error_code"] == "context_length_exceeded"


def test_completions_job(tmp_path: Path) -> None:
    lines = [
        {
            "custom_id": f"c{i}",
            "method": "POST",
            "url": "/v1/completions",
            "body": {"model": "smol", "prompt": p, "max_tokens": 12, "temperature": 0},
        }
        for i, p in enumerate(["The capital of France is", "1, 2, 3, 4,", "Once upon a time"])
    ]
    src = write_jsonl(tmp_path / "c.jsonl", lines)
    job = tmp_path / "job"
    run = cli("submit", str(src), "--job-dir", str(job), "--max-model-len", "512", "--no-progress")
    assert run.returncode == 0, run.stderr[-3000:]
    assert cli("export", "--job-dir", str(job)).returncode == 0
    out = read_jsonl(job / "output.jsonl")
    assert [o["custom_id"] for o in out] == ["c0", "c1", "c2"]
    bodies = [Completion.model_validate(o["response"]["body"]) for o in out]
    assert all(b.object == "text_completion" and b.choices[0].text for b in bodies)
    assert "5" in bodies[1].choices[0].text


def _wait_for_records(job: Path, count: int, proc: Any, timeout: float = 400) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (job / "journal.jsonl").exists() and len(journal_records(job)) >= count:
            return
        if proc.poll() is not None:
            pytest.fail(f"batchrun ended too early: {proc.communicate()[1][-3000:]}")
        time.sleep(0.2)
    pytest.fail(f"no {count} results within {timeout}s")


def test_kill_9_of_submit_then_of_the_worker_during_resume(tmp_path: Path) -> None:
    """kill -9 of the whole submit, then of the engine worker alone during resume: nothing lost."""
    prompts = ["Tell me about the sea.", "Describe a forest.", "Explain rain.", "Write about cats."]
    n = 32
    lines = [chat_line(f"k{i}", prompts[i % 4], max_tokens=48, temperature=0) for i in range(n)]
    src = write_jsonl(tmp_path / "k.jsonl", lines)
    job = tmp_path / "job"
    args = ("--max-model-len", "512", "--batch-size", "4", "--no-progress")
    p = start_cli("submit", str(src), "--job-dir", str(job), *args)
    _wait_for_records(job, 4, p)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    done_before = len(journal_records(job))
    assert 4 <= done_before < n
    p = start_cli("resume", "--job-dir", str(job), "--no-progress")
    _wait_for_records(job, done_before + 4, p)
    pids = worker_pids(p.pid)
    assert len(pids) == 1
    os.kill(pids[0], signal.SIGKILL)
    _, stderr = p.communicate(timeout=600)
    assert p.returncode == 0, stderr[-3000:]
    assert "killed by signal 9" in stderr
    records = journal_records(job)
    assert sorted(r["custom_id"] for r in records) == sorted(f"k{i}" for i in range(n))
    assert cli("export", "--job-dir", str(job)).returncode == 0
    out = read_jsonl(job / "output.jsonl")
    assert sorted(o["custom_id"] for o in out) == sorted(f"k{i}" for i in range(n))
    status = json.loads(cli("status", "--job-dir", str(job), "--json").stdout)
    assert status["status"] == "completed" and status["requests"]["succeeded"] == n


def test_sample_data_is_valid(tmp_path: Path) -> None:
    """The README's first command runs sample_data/requests.jsonl: every line of it must be valid."""
    from batchrun.openai.reader import read_input
    from batchrun.openai.records import Request

    items = list(read_input(ROOT / "sample_data" / "requests.jsonl"))
    assert items and all(isinstance(i, Request) for i in items)
