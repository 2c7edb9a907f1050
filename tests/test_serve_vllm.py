"""`batchrun serve` on the real vLLM engine with the default model, driven by the `openai` package:
the issue's flow (upload, create, poll, download) for two batches, on one engine start."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import chat_line, write_jsonl
from openai.types.chat import ChatCompletion
from test_serve import create_batch, lines_of, start_server, stop_server, wait_done

QUESTIONS = {
    "paris": "What is the capital of France? One word.",
    "two": "What is 1 plus 1? Answer with a number.",
    "blue": "What color is the sky on a clear day? One word.",
}


@pytest.mark.vllm
def test_two_batches_run_on_the_real_engine_loaded_once(tmp_path: Path) -> None:
    root = tmp_path / "root"
    # The server converts the default model first when this session has not (about 30 s).
    server = start_server(
        root, "--max-model-len", "1024", "--batch-size", "4", engine=None, timeout=300
    )
    try:
        client = server.client(api_key="unused")  # no --api-key: any key is accepted
        done = []
        for round_ in ("a", "b"):
            lines = [
                chat_line(f"{round_}-{cid}", text, max_tokens=12, temperature=0)
                for cid, text in QUESTIONS.items()
            ]
            batch = create_batch(client, write_jsonl(tmp_path / f"{round_}.jsonl", lines))
            done.append(wait_done(client, batch.id, timeout=420))
        for batch in done:
            assert batch.status == "completed", batch
            assert batch.request_counts is not None
            assert (batch.request_counts.total, batch.request_counts.completed) == (3, 3)
            assert batch.usage is not None and batch.usage.output_tokens > 0
            assert batch.error_file_id is None
        answers = {}
        for batch in done:
            for line in lines_of(client, batch.output_file_id):
                body = ChatCompletion.model_validate(line["response"]["body"])
                assert line["error"] is None and line["response"]["status_code"] == 200
                answers[line["custom_id"]] = body.choices[0].message.content or ""
        assert sorted(answers) == sorted(f"{r}-{c}" for r in "ab" for c in QUESTIONS)
        assert "paris" in answers["a-paris"].lower()  # the model really answers
        # Same greedy requests, same engine: the same answers in both batches.
        assert all(answers[f"a-{c}"] == answers[f"b-{c}"] for c in QUESTIONS)
    finally:
        stop_server(server)
    log = server.log.read_text()
    # The engine stays loaded between batches: one engine start for both.
    assert log.count("starting vllm engine") == 1, log[-3000:]
