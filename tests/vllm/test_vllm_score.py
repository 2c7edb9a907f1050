"""/v1/score and /v1/rerank on the real vLLM engine, checked against references made without vLLM.

The score and rerank samples run on all-MiniLM-L6-v2, an embedding model: each pair must score
the cosine similarity of the two texts' sentence embeddings, which tests/support/vllm_pooling.py computes
with transformers alone (the mean of the model's last hidden states), over the same tokens,
truncation included. A cross-encoder made from MiniLM's weights checks the other way vLLM scores:
each pair's score must be the classifier's own output on the tokenizer's text pair. Every body
parses with vLLM's own pydantic models and dumps back to itself: the shape is its server's.

The jobs are tests/support/vllm_pooling.py's; these tests read only their job, src, outputs, errors,
export and parquet (and submit, where the job was a `batchrun submit`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from support.vllm_jobs import body
from support.vllm_pooling import (
    CROSS_LINES,
    LONG,
    cosine,
    cross_encoder_score,
    cross_encoder_tokens,
    minilm_embedding,
    minilm_tokens,
    run_cross_encoder_job,
)

pytestmark = pytest.mark.vllm

MODEL = "text-embedding-3-small"  # the samples' model name, which the answers report
# The reference is float32; vLLM's "auto" runs a float32 pooling model in float16 (on a GPU, and
# on a CPU with native bf16, where batchrun leaves "auto" to vLLM), which moves a cosine by up to
# a few 1e-4 (1.4e-4 seen here). The echo engine's word overlap, another pooling (CLS instead of
# the mean), or a pair scored against the wrong text, are off by more than 0.01.
TOLERANCE = 2e-3
# The cross-encoder job runs in float32: its scores are transformers' to float32 rounding.
CROSS_TOLERANCE = 1e-5


def requests_of(job: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The job's input lines by custom_id (the invalid ones too, when they have one)."""
    lines = [json.loads(x) for x in Path(job["src"]).read_text(encoding="utf-8").splitlines()]
    return {line["custom_id"]: line for line in lines}


def finished(job: dict[str, Any], failing: set[str]) -> None:
    """The job ran to its end, exported both ways, with exactly `failing` failed or invalid."""
    assert job["export"].returncode == 0, job["export"].stderr[-3000:]
    assert job["parquet"].returncode == 0, job["parquet"].stderr[-3000:]
    run = job.get("submit")
    if run is not None:  # a `batchrun submit`: exit 1 when any request failed
        assert run.returncode == 1, run.stderr[-3000:]
        assert "Traceback" not in run.stderr
    assert set(job["errors"]) == failing
    assert set(job["outputs"]) == set(requests_of(job)) - failing


def pairs(queries: list[str], documents: list[str]) -> list[tuple[str, str]]:
    """vLLM's pairing: one query against every document, else the i-th against the i-th."""
    if len(queries) == 1:
        return [(queries[0], d) for d in documents]
    return list(zip(queries, documents, strict=True))


def as_list(value: str | list[str]) -> list[str]:
    return [value] if isinstance(value, str) else value


def score_sides(request_body: dict[str, Any]) -> tuple[list[str], list[str]]:
    """A score body's two sides, whichever of vLLM's names it uses."""
    for first, second in (("text_1", "text_2"), ("queries", "documents")):
        if first in request_body and second in request_body:
            return as_list(request_body[first]), as_list(request_body[second])
    if "items" in request_body:
        return as_list(request_body["queries"]), as_list(request_body["items"])
    return as_list(request_body["data_1"]), as_list(request_body["data_2"])


def minilm_ids(text: str, request_body: dict[str, Any]) -> list[int]:
    """A text's tokens as vLLM truncates them for the request: the tokenizer's own truncation,
    or a slice of one side when truncation_side is given."""
    keep = request_body.get("truncate_prompt_tokens")
    if keep is None:
        return minilm_tokens(text)
    if request_body.get("truncation_side") is None:
        return minilm_tokens(text, truncation=True, max_length=keep)
    ids = minilm_tokens(text)
    return ids[-keep:] if request_body["truncation_side"] == "left" else ids[:keep]


def reference(
    queries: list[str], documents: list[str], request_body: dict[str, Any]
) -> list[float]:
    """Each pair's cosine similarity of MiniLM's embeddings, computed with transformers."""
    embed = {t: minilm_embedding(minilm_ids(t, request_body)) for t in {*queries, *documents}}
    return [cosine(embed[q], embed[d]) for q, d in pairs(queries, documents)]


def prompt_tokens(queries: list[str], documents: list[str], request_body: dict[str, Any]) -> int:
    """vLLM's count: every text embedded once (the one query of 1:N too), its tokens summed."""
    return sum(len(minilm_ids(t, request_body)) for t in [*queries, *documents])


# --- /v1/score on an embedding model ----------------------------------------------------------

SCORE_FAILING = {"too-long", "refused-lengths", "refused-unknown"}


def test_score_bodies_are_vllms_score_responses(vllm_score_job: dict[str, Any]) -> None:
    from vllm.entrypoints.pooling.scoring.protocol import ScoreResponse

    finished(vllm_score_job, SCORE_FAILING)
    for cid, request in requests_of(vllm_score_job).items():
        if cid in SCORE_FAILING:
            continue
        answer = body(vllm_score_job, cid)
        assert ScoreResponse.model_validate(answer).model_dump() == answer
        assert answer["model"] == MODEL and answer["id"].startswith("score-")
        _, documents = score_sides(request["body"])
        assert [d["index"] for d in answer["data"]] == list(range(len(documents)))
        usage = answer["usage"]
        assert usage["prompt_tokens"] == usage["total_tokens"] > 0
        assert usage["completion_tokens"] == 0


def test_scores_are_the_cosine_similarity_of_the_models_embeddings(
    vllm_score_job: dict[str, Any],
) -> None:
    checked = 0
    for cid, request in requests_of(vllm_score_job).items():
        if cid in SCORE_FAILING:
            continue
        answer = body(vllm_score_job, cid)
        queries, documents = score_sides(request["body"])
        expected = reference(queries, documents, request["body"])
        scores = [d["score"] for d in answer["data"]]
        assert scores == pytest.approx(expected, abs=TOLERANCE), cid
        assert answer["usage"]["prompt_tokens"] == prompt_tokens(
            queries, documents, request["body"]
        ), cid
        checked += len(scores)
    assert checked == 10  # every pair of the sample's six answered lines


def test_related_texts_score_higher_than_unrelated_ones(vllm_score_job: dict[str, Any]) -> None:
    def scores(cid: str) -> list[float]:
        return [d["score"] for d in body(vllm_score_job, cid)["data"]]

    cat_dog, cat_kitten, cat_stocks = scores("one-to-many")
    assert cat_kitten > cat_dog > cat_stocks
    sunny_bright, guitar_rates = scores("many-to-many")
    assert sunny_bright > guitar_rates
    bread_recipe, bread_train = scores("items")
    assert bread_recipe > bread_train
    (same,) = scores("data")  # a text against itself
    assert same == pytest.approx(1.0, abs=TOLERANCE)
    (capital,) = scores("pair")
    assert capital > 0.5


def test_score_refusals_name_the_field(vllm_score_job: dict[str, Any]) -> None:
    errors = vllm_score_job["errors"]
    long_tokens = len(minilm_tokens(LONG))
    assert errors["too-long"]["response"]["status_code"] == 400
    assert errors["too-long"]["error"] == {
        "code": "context_length_exceeded",
        "message": f"this model's maximum context length is 256 tokens; body.text_2[1] has "
        f"{long_tokens} tokens",
        "line": 7,
    }
    assert errors["refused-lengths"]["response"] is None
    assert errors["refused-lengths"]["error"]["line"] == 8
    assert errors["refused-unknown"]["error"]["message"] == (
        "body.text1 is not a field of a /v1/score request; remove it"
    )


def test_score_parquet_holds_each_lines_scores(vllm_score_job: dict[str, Any]) -> None:
    df = pd.read_parquet(vllm_score_job["job"] / "results.parquet").set_index("custom_id")
    for cid in vllm_score_job["outputs"]:
        answer = body(vllm_score_job, cid)
        assert list(df.loc[cid, "scores"]) == [d["score"] for d in answer["data"]]
        assert list(df.loc[cid, "score_indices"]) == [d["index"] for d in answer["data"]]
        assert df.loc[cid, "prompt_tokens"] == answer["usage"]["prompt_tokens"]
    assert df.loc["too-long", "error_code"] == "context_length_exceeded"


# --- /v1/rerank on an embedding model ---------------------------------------------------------

RERANK_FAILING = {"too-long", "refused-query-list", "refused-top-n"}


def results(job: dict[str, Any], cid: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = body(job, cid)["results"]
    return found


def test_rerank_bodies_are_vllms_rerank_responses(vllm_rerank_job: dict[str, Any]) -> None:
    from vllm.entrypoints.pooling.scoring.protocol import RerankResponse

    finished(vllm_rerank_job, RERANK_FAILING)
    for cid, request in requests_of(vllm_rerank_job).items():
        if cid in RERANK_FAILING:
            continue
        answer = body(vllm_rerank_job, cid)
        assert RerankResponse.model_validate(answer).model_dump() == answer
        assert answer["model"] == MODEL
        documents = as_list(request["body"]["documents"])
        for result in answer["results"]:
            assert result["document"]["text"] == documents[result["index"]]
        usage = answer["usage"]
        assert (
            usage["prompt_tokens"]
            == usage["total_tokens"]
            == prompt_tokens([request["body"]["query"]], documents, request["body"])
        )


def test_rerank_results_are_the_cosine_similarities_best_first(
    vllm_rerank_job: dict[str, Any],
) -> None:
    requests = requests_of(vllm_rerank_job)
    for cid in ("rank", "top-n-zero", "truncated", "one-document"):
        request_body = requests[cid]["body"]
        documents = as_list(request_body["documents"])
        expected = reference([request_body["query"]], documents, request_body)
        ranked = results(vllm_rerank_job, cid)
        assert len(ranked) == len(documents)  # no top_n, or 0: every document
        scores = [r["relevance_score"] for r in ranked]
        assert scores == sorted(scores, reverse=True), cid
        assert scores == pytest.approx([expected[r["index"]] for r in ranked], abs=TOLERANCE)
    # What do cats eat? The two documents about cats' food first.
    assert {r["index"] for r in results(vllm_rerank_job, "rank")[:2]} == {0, 3}
    (same,) = results(vllm_rerank_job, "one-document")
    assert same["relevance_score"] == pytest.approx(1.0, abs=TOLERANCE)


def test_rerank_top_n_keeps_the_best(vllm_rerank_job: dict[str, Any]) -> None:
    everything = results(vllm_rerank_job, "rank")
    top = results(vllm_rerank_job, "top-n")
    assert len(top) == 2
    assert [r["index"] for r in top] == [r["index"] for r in everything[:2]]
    assert [r["relevance_score"] for r in top] == pytest.approx(
        [r["relevance_score"] for r in everything[:2]], abs=1e-6
    )


def test_identical_rerank_lines_run_once_with_ids_of_their_own(
    vllm_rerank_job: dict[str, Any],
) -> None:
    first, again = body(vllm_rerank_job, "rank"), body(vllm_rerank_job, "rank-again")
    assert again["results"] == first["results"] and again["id"] != first["id"]


def test_rerank_refusals_name_the_field(vllm_rerank_job: dict[str, Any]) -> None:
    errors = vllm_rerank_job["errors"]
    assert errors["too-long"]["error"]["code"] == "context_length_exceeded"
    assert errors["too-long"]["error"]["message"] == (
        f"this model's maximum context length is 256 tokens; body.documents[1] has "
        f"{len(minilm_tokens(LONG))} tokens"
    )
    assert errors["refused-query-list"]["error"]["message"] == (
        "body.query must be a string, got an array of 1 item"
    )
    df = pd.read_parquet(vllm_rerank_job["job"] / "results.parquet").set_index("custom_id")
    ranked = results(vllm_rerank_job, "rank")
    assert list(df.loc["rank", "score_indices"]) == [r["index"] for r in ranked]
    assert list(df.loc["rank", "scores"]) == [r["relevance_score"] for r in ranked]


# --- /v1/score on a cross-encoder ---------------------------------------------------------------


@pytest.fixture(scope="module")
def cross_job(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """CROSS_LINES on a cross-encoder made from MiniLM (1 engine start)."""
    return run_cross_encoder_job(tmp_path_factory.mktemp("vllm-cross-encoder"))


def test_a_cross_encoder_scores_each_pair_with_its_classifier(cross_job: dict[str, Any]) -> None:
    from vllm.entrypoints.pooling.scoring.protocol import ScoreResponse

    finished(cross_job, {"too-long"})
    model = cross_job["model"]
    checked = 0
    for line in CROSS_LINES:
        cid, request_body = line["custom_id"], line["body"]
        if cid == "too-long":
            continue
        answer = body(cross_job, cid)
        assert ScoreResponse.model_validate(answer).model_dump() == answer
        keep = request_body.get("truncate_prompt_tokens")
        kwargs = {} if keep is None else {"truncation": True, "max_length": keep}
        queries, documents = score_sides(request_body)
        expected = [
            cross_encoder_score(model, q, d, **kwargs) for q, d in pairs(queries, documents)
        ]
        scores = [d["score"] for d in answer["data"]]
        assert scores == pytest.approx(expected, abs=CROSS_TOLERANCE), cid
        # One prompt a pair: the query's tokens count once per pair.
        assert answer["usage"]["prompt_tokens"] == sum(
            cross_encoder_tokens(model, q, d, **kwargs) for q, d in pairs(queries, documents)
        )
        checked += len(expected)
    assert checked == 7


def test_a_cross_encoder_refuses_a_pair_too_long(cross_job: dict[str, Any]) -> None:
    error = cross_job["errors"]["too-long"]
    assert error["response"]["status_code"] == 400
    assert error["error"]["code"] == "context_length_exceeded"
    assert error["error"]["message"].startswith(
        "body.text_1 with body.text_2: This model's maximum context length is 512 tokens."
    )
