"""/v1/score and /v1/rerank (vLLM's scoring APIs) without a model: the rules of a line, the typed
fields both engines read, the echo engine's answers, and their export (JSONL and Parquet).

The real engine's scores are tests/vllm/test_vllm_score.py's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.parquet as pq
import pytest
from support.cli import cli
from support.jobs import submit_echo
from support.lines import read_jsonl, write_jsonl
from support.paths import ROOT

from batchrun.config import EngineSettings
from batchrun.engines.echo import EchoEngine, word_cosine
from batchrun.openai.invalid import InvalidLine
from batchrun.openai.params import score_params
from batchrun.openai.records import (
    EMBEDDINGS,
    POOLING_ENDPOINTS,
    RERANK,
    SCORE,
    SUPPORTED_ENDPOINTS,
    Outcome,
    Request,
)
from batchrun.openai.validation import check_body, check_url
from batchrun.run.dedup import dedup_key
from batchrun.run.planner import prompt_text
from batchrun.run.tuning import cache_key
from batchrun.serve.router import engine_kind

SCORE_SAMPLE = ROOT / "sample_data" / "score.jsonl"
RERANK_SAMPLE = ROOT / "sample_data" / "rerank.jsonl"
DOCS = ["Cats eat fish.", "Stocks fell today.", "A cat eats fish and meat."]


def refused(url: str, **body: Any) -> str:
    """The message a body breaking a rule is refused with."""
    with pytest.raises(InvalidLine) as e:
        check_body(url, {"body": body})
    assert e.value.code == "invalid_request"
    return e.value.message


def run_echo(url: str, **body: Any) -> dict[str, Any]:
    """The echo engine's answer body to one request."""
    check_body(url, {"body": body})
    engine = EchoEngine(EngineSettings(engine="echo", model_name="echo-model"))
    assert engine.add(Request("r", 1, url, body)) is None
    (outcome,) = engine.step()
    assert isinstance(outcome, Outcome) and outcome.ok and isinstance(outcome.body, dict)
    return outcome.body


# --- urls ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("url", ["/v1/score", "/score", "/v1/rerank", "/rerank", "/v2/rerank"])
def test_score_and_rerank_urls_are_taken_with_and_without_v1(url: str) -> None:
    assert check_url({"url": url}) == url
    assert url in SUPPORTED_ENDPOINTS and url in POOLING_ENDPOINTS


def test_other_score_like_urls_are_refused() -> None:
    with pytest.raises(InvalidLine) as e:
        check_url({"url": "/v2/score"})
    assert e.value.message.startswith("url must be one of ") and "'/rerank'" in e.value.message


def test_pooling_endpoints_share_one_engine_kind_and_size_cache() -> None:
    kinds = {engine_kind(url) for url in POOLING_ENDPOINTS}
    assert kinds == {"embed"} and engine_kind("/v1/chat/completions") == "generate"
    keys = {cache_key(EngineSettings(endpoint=url), "cpu") for url in POOLING_ENDPOINTS}
    assert len(keys) == 1 and keys != {cache_key(EngineSettings(endpoint=None), "cpu")}


# --- the rules of a score body --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("first", "second"),
    [("text_1", "text_2"), ("queries", "documents"), ("queries", "items"), ("data_1", "data_2")],
)
def test_score_takes_each_of_vllms_four_pairs_of_names(first: str, second: str) -> None:
    body = {first: "a query", second: ["one", "two"]}
    check_body(SCORE, {"body": body})
    fields = score_params(Request("r", 1, SCORE, body))
    assert fields.names == (first, second)
    assert (fields.queries, fields.documents) == (["a query"], ["one", "two"])
    assert fields.single == (True, False) and not fields.rerank


def test_score_pairs_one_to_one_one_to_many_and_many_to_many() -> None:
    def pairs(a: Any, b: Any) -> list[tuple[int, int]]:
        return score_params(Request("r", 1, SCORE, {"text_1": a, "text_2": b})).pairs()

    assert pairs("q", "d") == [(0, 0)]
    assert pairs("q", ["a", "b", "c"]) == [(0, 0), (0, 1), (0, 2)]
    assert pairs(["q"], ["a", "b"]) == [(0, 0), (0, 1)]
    assert pairs(["q", "r"], ["a", "b"]) == [(0, 0), (1, 1)]


def test_score_needs_one_pair_of_names() -> None:
    assert refused(SCORE, model="m") == (
        "body must hold the texts to score: text_1 and text_2, queries and documents, queries "
        "and items, or data_1 and data_2"
    )
    assert refused(SCORE, text_1="a") == (
        "body.text_1 needs body.text_2: the texts of one are scored against the texts of the other"
    )
    assert refused(SCORE, queries="a") == (
        "body.queries needs body.documents (or body.items): the texts of one are scored against "
        "the texts of the other"
    )
    assert refused(SCORE, items=["a"]) == (
        "body.items needs body.queries: the texts of one are scored against the texts of the other"
    )
    assert refused(SCORE, text_1="a", data_2="b") == (
        "body.text_1 and body.data_2 mix two ways of naming the texts; give one pair: text_1 and "
        "text_2, queries and documents, queries and items, or data_1 and data_2"
    )
    assert refused(SCORE, queries="a", documents="b", items="c").startswith(
        "body.queries, body.documents and body.items mix two ways"
    )
    # null means "not set", as everywhere: the other pair counts.
    check_body(SCORE, {"body": {"text_1": "a", "text_2": "b", "queries": None}})


def test_score_texts_are_strings_or_arrays_of_them() -> None:
    assert refused(SCORE, text_1=1, text_2="b") == (
        "body.text_1 must be a string or an array of strings, got a number 1"
    )
    assert (
        refused(SCORE, text_1="a", text_2=["b", 3])
        == "body.text_2[1] must be a string, got a number 3"
    )
    assert refused(SCORE, text_1="", text_2="b") == "body.text_1 must not be empty"
    assert refused(SCORE, text_1="a", text_2=["b", ""]) == "body.text_2[1] must not be empty"
    assert refused(SCORE, text_1="a", text_2=[]) == "body.text_2 must not be an empty array"
    assert refused(SCORE, text_1="a", text_2=["b"] * 2049) == (
        "body.text_2 may hold at most 2048 texts, got 2049"
    )
    image = {"content": [{"type": "image_url", "image_url": {"url": "x"}}]}
    assert refused(SCORE, data_1="a", data_2=[image]) == (
        "body.data_2[0] must be a string, got an object (multimodal content is not scored: "
        "batchrun runs text models)"
    )


def test_score_sides_pair_one_to_many_or_many_to_many() -> None:
    assert refused(SCORE, queries=["a", "b"], documents=["c", "d", "e"]) == (
        "body.queries holds 2 texts and body.documents 3: pairs are 1:1, 1:N or N:N, so "
        "body.queries must hold one text or as many as body.documents"
    )
    assert refused(SCORE, text_1=["a", "b"], text_2="c").startswith("body.text_1 holds 2 texts")


def test_score_fields_are_vllms_and_others_are_refused_by_name() -> None:
    ok = {"text_1": "a", "text_2": "b"}
    check_body(
        SCORE,
        {
            "body": {
                **ok,
                "model": "m",
                "user": "u",
                "truncate_prompt_tokens": -1,
                "truncation_side": "left",
                "max_tokens_per_query": 0,
                "max_tokens_per_doc": 8,
                "use_activation": False,
            }
        },
    )
    assert (
        refused(SCORE, **ok, top_n=2)
        == "body.top_n is not a field of a /v1/score request; remove it"
    )
    assert refused("/score", text1="a", text2="b") == (
        "body.text1 is not a field of a /score request; remove it"
    )
    assert refused(SCORE, **ok, truncate_prompt_tokens=0) == (
        "body.truncate_prompt_tokens must be -1 (the model's context length) or at least 1, got 0"
    )
    assert refused(SCORE, **ok, truncation_side="middle") == (
        "body.truncation_side must be 'left' or 'right', got 'middle'"
    )
    assert refused(SCORE, **ok, max_tokens_per_doc=-1) == (
        "body.max_tokens_per_doc must be at least 0, got -1"
    )
    assert refused(SCORE, **ok, use_activation="yes") == (
        "body.use_activation must be true or false, got a string 'yes'"
    )
    assert refused(SCORE, **ok, priority=1) == (
        "body.priority is not supported: batchrun orders a job's requests itself; remove it"
    )
    assert refused(SCORE, **ok, instruction="Judge relevance.") == (
        "body.instruction is not supported: it is rendered by a score template, which batchrun "
        "does not load; remove it"
    )


# --- the rules of a rerank body -------------------------------------------------------------------


def test_rerank_takes_a_query_documents_and_top_n() -> None:
    body = {"query": "q", "documents": DOCS, "top_n": 2, "model": "m"}
    check_body(RERANK, {"body": body})
    fields = score_params(Request("r", 1, RERANK, body))
    assert (fields.queries, fields.documents, fields.top_n) == (["q"], DOCS, 2)
    assert fields.rerank and fields.names == ("query", "documents")
    # top_n 0 (vLLM's default) returns every result, as its absence does.
    for top_n in (0, None):
        assert score_params(Request("r", 1, RERANK, {**body, "top_n": top_n})).top_n is None


def test_rerank_rules() -> None:
    assert refused(RERANK, documents=DOCS) == (
        "body.query is missing; a rerank request ranks body.documents against it"
    )
    assert refused(RERANK, query=["q"], documents=DOCS) == (
        "body.query must be a string, got an array of 1 item"
    )
    assert refused(RERANK, query="", documents=DOCS) == "body.query must not be empty"
    assert refused(RERANK, query="q") == (
        "body.documents is missing; a rerank request ranks them against body.query"
    )
    assert refused(RERANK, query="q", documents=[DOCS[0], None]) == (
        "body.documents[1] must be a string, got null"
    )
    assert refused(RERANK, query="q", documents=DOCS, top_n=-1) == (
        "body.top_n must be at least 0, got -1"
    )
    assert refused("/rerank", query="q", documents=DOCS, text_1="a") == (
        "body.text_1 is not a field of a /rerank request; remove it"
    )


# --- the echo engine ------------------------------------------------------------------------------


def test_echo_scores_the_word_overlap_of_each_pair_in_vllms_shape() -> None:
    body = run_echo(SCORE, model="m", queries="A cat eats fish.", documents=DOCS)
    assert body["object"] == "list" and body["model"] == "m"
    assert body["id"].startswith("score-") and isinstance(body["created"], int)
    assert [d["index"] for d in body["data"]] == [0, 1, 2]
    assert {d["object"] for d in body["data"]} == {"score"}
    scores = [d["score"] for d in body["data"]]
    assert scores == [
        word_cosine(["a", "cat", "eats", "fish"], w.lower().rstrip(".").split()) for w in DOCS
    ]
    assert scores[1] == 0.0 and scores[2] > scores[0] > 0  # "a cat eats fish" shares 4 words
    # Each text counted once (the one query of 1:N too): 4 + 3 + 3 + 6 words.
    assert body["usage"] == {
        "prompt_tokens": 16,
        "total_tokens": 16,
        "completion_tokens": 0,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }


def test_echo_scores_identical_texts_one_and_pairs_many_to_many() -> None:
    body = run_echo("/score", text_1=["hello world", "a b"], text_2=["Hello, world!", "c"])
    assert [d["score"] for d in body["data"]] == [pytest.approx(1.0), 0.0]


def test_echo_reranks_best_first_and_keeps_top_n() -> None:
    body = run_echo(RERANK, model="m", query="Which cat eats fish?", documents=DOCS, top_n=2)
    assert set(body) == {"id", "model", "usage", "results"}
    assert body["usage"] == {"prompt_tokens": 4 + 3 + 3 + 6, "total_tokens": 16}
    results = body["results"]
    assert [r["index"] for r in results] == [2, 0]
    assert results[0]["document"] == {"text": DOCS[2], "multi_modal": None}
    scores = [r["relevance_score"] for r in results]
    assert scores == sorted(scores, reverse=True)
    everything = run_echo(RERANK, query="Which cat eats fish?", documents=DOCS)["results"]
    assert [r["index"] for r in everything] == [2, 0, 1]
    # Equal scores (none shares a word with "q") keep the documents' order, as vLLM's sort does.
    tied = run_echo(RERANK, query="q", documents=DOCS, top_n=0)["results"]
    assert [r["index"] for r in tied] == [0, 1, 2]


def test_echo_honours_the_truncation_fields_in_words() -> None:
    text = "one two three four five"

    def usage(**body: Any) -> int:
        tokens: int = run_echo(SCORE, text_1=text, text_2="five", **body)["usage"]["prompt_tokens"]
        return tokens

    assert usage() == 6
    assert usage(truncate_prompt_tokens=2) == 3
    assert usage(max_tokens_per_query=3) == 4
    right = run_echo(SCORE, text_1=text, text_2="five", truncate_prompt_tokens=2)
    left = run_echo(
        SCORE, text_1=text, text_2="five", truncate_prompt_tokens=2, truncation_side="left"
    )
    assert right["data"][0]["score"] == 0.0 and left["data"][0]["score"] > 0  # "four five"


def test_echo_bodies_parse_with_vllms_own_models() -> None:
    protocol = pytest.importorskip("vllm.entrypoints.pooling.scoring.protocol")
    score = run_echo(SCORE, text_1="a cat", text_2=["a dog", "a cat"])
    parsed = protocol.ScoreResponse.model_validate(score)
    assert parsed.model_dump() == score  # every field vLLM's server writes, and no other
    rerank = run_echo(RERANK, query="a cat", documents=["a dog", "a cat"], top_n=1)
    assert protocol.RerankResponse.model_validate(rerank).model_dump() == rerank


# --- the plan: deduplication and order ------------------------------------------------------------


def test_identical_score_lines_are_deterministic_and_deduplicated() -> None:
    body = {"query": "q", "documents": DOCS}
    a, b = Request("a", 1, RERANK, body), Request("b", 2, RERANK, dict(body))
    assert dedup_key(a) is not None and dedup_key(a) == dedup_key(b)
    assert dedup_key(Request("c", 3, RERANK, {**body, "top_n": 1})) != dedup_key(a)
    assert dedup_key(Request("e", 1, EMBEDDINGS, {"input": "q"})) is not None


def test_the_plan_reads_the_query_first() -> None:
    text = prompt_text(Request("a", 1, SCORE, {"queries": ["q1", "q2"], "items": ["d1", "d2"]}))
    assert text == "q1\x1eq2\x1ed1\x1ed2"
    assert prompt_text(Request("a", 1, RERANK, {"query": "q", "documents": "d"})) == "q\x1ed"


# --- end to end on the echo engine: the samples, exported -----------------------------------------


@pytest.fixture(scope="module")
def echo_jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The score and rerank samples, each a job on the echo engine, exported both ways."""
    jobs = {}
    for name, sample in (("score", SCORE_SAMPLE), ("rerank", RERANK_SAMPLE)):
        job = tmp_path_factory.mktemp(name) / "job"
        run = submit_echo(sample, job)
        assert run.returncode == 1, run.stderr  # the sample's invalid lines
        for extra in ((), ("--parquet",)):
            out = cli("export", "--job-dir", str(job), *extra)
            assert out.returncode == 0, out.stderr
        jobs[name] = job
    return jobs


def test_echo_score_sample_exports_its_answers_and_invalid_lines(
    echo_jobs: dict[str, Path],
) -> None:
    job = echo_jobs["score"]
    outputs = {line["custom_id"]: line for line in read_jsonl(job / "output.jsonl")}
    errors = {line["custom_id"]: line for line in read_jsonl(job / "errors.jsonl")}
    assert set(errors) == {"refused-lengths", "refused-unknown"}
    assert errors["refused-unknown"]["error"] == {
        "code": "invalid_request",
        "message": "body.text1 is not a field of a /v1/score request; remove it",
        "line": 9,
    }
    body = outputs["one-to-many"]["response"]["body"]
    assert body["model"] == "text-embedding-3-small" and len(body["data"]) == 3
    assert outputs["data"]["response"]["body"]["data"][0]["score"] == pytest.approx(1.0)
    df = pd.read_parquet(job / "results.parquet").set_index("custom_id")
    assert (
        str(pq.read_schema(job / "results.parquet").field("scores").type) == "list<element: double>"
    )
    assert list(df.loc["one-to-many", "scores"]) == [d["score"] for d in body["data"]]
    assert list(df.loc["one-to-many", "score_indices"]) == [0, 1, 2]
    assert df.loc["one-to-many", "n_choices"] == 3
    assert df.loc["one-to-many", "prompt_tokens"] == body["usage"]["prompt_tokens"]
    assert df.loc["one-to-many", "response_id"] == body["id"]
    assert df.loc["refused-lengths", "scores"] is None


def test_echo_rerank_sample_exports_ranked_results(echo_jobs: dict[str, Path]) -> None:
    job = echo_jobs["rerank"]
    outputs = {line["custom_id"]: line for line in read_jsonl(job / "output.jsonl")}
    errors = {line["custom_id"]: line for line in read_jsonl(job / "errors.jsonl")}
    assert set(errors) == {"refused-query-list", "refused-top-n"}
    ranked = outputs["rank"]["response"]["body"]["results"]
    assert len(ranked) == 4 and len(outputs["top-n"]["response"]["body"]["results"]) == 2
    # The identical line ran once: its answer is a copy, under an id of its own.
    again = outputs["rank-again"]["response"]["body"]
    assert again["results"] == ranked and again["id"] != outputs["rank"]["response"]["body"]["id"]
    records = [json.loads(x) for x in (job / "journal.jsonl").read_text().splitlines()]
    assert any(r.get("copy_of") == "rank" for r in records)
    df = pd.read_parquet(job / "results.parquet").set_index("custom_id")
    assert list(df.loc["rank", "score_indices"]) == [r["index"] for r in ranked]
    assert list(df.loc["rank", "scores"]) == [r["relevance_score"] for r in ranked]
    assert list(df.loc["top-n", "score_indices"]) == [r["index"] for r in ranked[:2]]
    assert df.loc["rank", "n_choices"] == 4


@pytest.mark.parametrize("url", ["/rerank", "/v2/rerank"])
def test_a_rerank_job_on_another_spelling_of_the_url(tmp_path: Path, url: str) -> None:
    line = {"custom_id": "a", "method": "POST", "url": url}
    src = write_jsonl(
        tmp_path / "in.jsonl", [{**line, "body": {"query": "cat", "documents": ["a cat", "x"]}}]
    )
    job = tmp_path / "job"
    run = submit_echo(src, job)
    assert run.returncode == 0, run.stderr
    assert cli("export", "--job-dir", str(job)).returncode == 0
    (out,) = read_jsonl(job / "output.jsonl")
    assert [r["index"] for r in out["response"]["body"]["results"]] == [0, 1]
