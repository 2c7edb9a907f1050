"""batchrun from Python on the real vLLM engine (1 engine start): a small job made from a pandas
DataFrame by `batchrun.run` in this process, on the embedded default model, its answers read back
as a DataFrame and as OpenAI's own types. Its own xdist group (conftest.py: a vllm test with no
shared job is grouped by its module), so its start spreads like the shared jobs'."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from openai.types.chat import ChatCompletion
from support.api_jobs import api_process
from support.lines import chat_line
from support.settings import TEST_KV_CACHE_BYTES

import batchrun

pytestmark = pytest.mark.vllm

__all__ = ["api_process"]  # the fixture, used by name

QUESTIONS = {
    "capital": "What is the capital of France? One word.",
    "sum": "What is 1 plus 1? Answer briefly.",
    "color": "Name a primary color.",
}


def test_a_python_run_on_the_real_engine(tmp_path: Path, api_process: None) -> None:
    import pandas as pd

    frame = pd.DataFrame(
        [chat_line(cid, text, max_tokens=8, temperature=0) for cid, text in QUESTIONS.items()]
    )
    options: dict[str, Any] = {
        "max_model_len": 512,
        "kv_cache_memory_bytes": TEST_KV_CACHE_BYTES,  # the CLI's tests get it from the env
        "batch_size": 4,
        "progress": False,
    }
    job = batchrun.run(frame, job_dir=tmp_path / "job", **options)
    status = job.status()
    assert status["status"] == "completed", status
    assert status["requests"]["succeeded"] == 3 and status["requests"]["pending"] == 0
    answers = job.to_pandas().set_index("custom_id")
    assert set(answers.index) == set(QUESTIONS)
    assert (answers["status"] == "succeeded").all()
    assert all(isinstance(text, str) and text.strip() for text in answers["content"])
    assert (answers["completion_tokens"] > 0).all() and (answers["completion_tokens"] <= 8).all()
    # The same answers as export writes them, each body OpenAI's own ChatCompletion.
    summary = job.export()
    lines = [json.loads(x) for x in summary.paths[0].read_text(encoding="utf-8").splitlines()]
    bodies = {
        line["custom_id"]: ChatCompletion.model_validate(line["response"]["body"]) for line in lines
    }
    assert {cid: b.choices[0].message.content for cid, b in bodies.items()} == dict(
        answers["content"]
    )
