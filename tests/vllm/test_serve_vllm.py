"""`batchrun serve` on the real vLLM engine, driven by the `openai` package: the issue's flow
(upload, create, poll, download) for several batches on one server and one engine start, on a
generative model (the completions and responses jobs and a third batch, across a kill -9 and a
start on Ray) and on an embedding model (embeddings, score and rerank batches:
tests/support/vllm_served.py)."""

from __future__ import annotations

from typing import Any

import pytest
from openai.types import CreateEmbeddingResponse
from openai.types.responses import Response
from support.vllm_jobs import RESPONSES_REASONING

pytestmark = pytest.mark.vllm


def _one_engine_start(log: str) -> None:
    # The engine stays loaded between batches: one start for all of them.
    assert log.count("starting vllm engine") == 1, log[-3000:]
    assert " died" not in log, log[-3000:]


def test_batches_of_a_generative_model_run_on_the_engine_loaded_once(
    vllm_generative_server: dict[str, Any],
) -> None:
    """Three batches; the server is killed with SIGKILL in the first and started again on Ray:
    each server started its engine once, the second finished all three."""
    served = vllm_generative_server
    answers: dict[str, str] = {}
    for name in ("completions", "responses", "again"):
        batch = served[name]["batch"]
        assert batch.status == "completed", batch
        assert batch.usage is not None and batch.usage.output_tokens > 0
        assert batch.request_counts is not None
        # The batch's token details are its answers' (the engine's counts), not zeros.
        usages = [line["response"]["body"]["usage"] for line in served[name]["files"]["output"]]
        cached = sum(
            (u.get("prompt_tokens_details") or u.get("input_tokens_details"))["cached_tokens"]
            for u in usages
        )
        thought = sum(
            (u.get("output_tokens_details") or {}).get("reasoning_tokens", 0) for u in usages
        )
        assert batch.usage.input_tokens_details.cached_tokens == cached, (batch.usage, usages)
        assert batch.usage.output_tokens_details.reasoning_tokens == thought, batch.usage
        assert (thought > 0) == (name != "completions"), batch.usage  # the thinking template
    for name in ("responses", "again"):
        for line in served[name]["files"]["output"]:
            assert line["error"] is None and line["response"]["status_code"] == 200
            body = Response.model_validate(line["response"]["body"])
            answers[line["custom_id"]] = body.output_text
    ids = [r["custom_id"] for r in RESPONSES_REASONING]
    assert served["again"]["batch"].request_counts.completed == len(ids)
    # Same greedy requests, same engine: the same answers in both batches.
    assert [answers[f"again-{cid}"] for cid in ids] == [answers[cid] for cid in ids]
    assert "4" in answers["think-shots"]  # the model really answers
    for log in served["logs"]:
        _one_engine_start(log)


def test_embeddings_score_and_rerank_batches_share_one_pooling_engine(
    vllm_pooling_server: dict[str, Any],
) -> None:
    served = vllm_pooling_server
    for name in ("embeddings", "score", "rerank"):
        batch = served[name]["batch"]
        assert batch.status == "completed", (name, batch)
        assert batch.request_counts is not None and batch.request_counts.completed > 0
        assert batch.request_counts.failed == len(served[name]["files"]["error"])
    floats = [
        line for line in served["embeddings"]["files"]["output"] if line["custom_id"] != "base64"
    ]  # (the openai package types an embedding as floats only)
    for line in floats:
        body = CreateEmbeddingResponse.model_validate(line["response"]["body"])
        assert body.data and all(len(d.embedding) == 384 for d in body.data)  # MiniLM's size
    assert len(served["embeddings"]["files"]["output"]) >= 6
    _one_engine_start(served["log"])
