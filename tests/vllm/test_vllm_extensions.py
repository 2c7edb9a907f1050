"""vLLM's sampling extensions on the real engine: sample_data/chat_vllm_extensions.jsonl, lines
39-52 of the shared chat job (tests/support/vllm_jobs.py), on the default model (SmolLM2-135M-Instruct).
Each honoured field is checked by what it does to the answer, against a line without it."""

from __future__ import annotations

from typing import Any

import pytest
from support.openai_checks import parse_body
from support.vllm_jobs import EXTENSIONS_SAMPLE, chat_job_part

from batchrun.openai.records import CHAT

pytestmark = pytest.mark.vllm


@pytest.fixture
def ext_job(vllm_chat_job: dict[str, Any]) -> dict[str, Any]:
    return chat_job_part(vllm_chat_job, EXTENSIONS_SAMPLE)


def _choice(job: dict[str, Any], cid: str) -> Any:
    out = job["outputs"][cid]
    assert out["response"]["status_code"] == 200 and out["error"] is None, out
    return parse_body(CHAT, out["response"]["body"]).choices[0]


def _content(job: dict[str, Any], cid: str) -> str:
    text = _choice(job, cid).message.content
    assert isinstance(text, str)
    return text


def _tokens(job: dict[str, Any], cid: str) -> int:
    usage = job["outputs"][cid]["response"]["body"]["usage"]
    return int(usage["completion_tokens"])


def test_the_sample_runs_where_the_job_put_it(ext_job: dict[str, Any]) -> None:
    assert [ext_job["lines"][cid] for cid in ext_job["requests"]] == list(range(39, 53))
    refused = {"refused-beam-search", "refused-min-tokens-over-max"}
    assert set(ext_job["errors"]) == refused | {"refused-allowed-token-out-of-vocab"}
    assert set(ext_job["outputs"]) == set(ext_job["requests"]) - set(ext_job["errors"])


def test_top_k_1_samples_the_greedy_answer_at_any_temperature(ext_job: dict[str, Any]) -> None:
    greedy = _content(ext_job, "ext-greedy")
    assert _content(ext_job, "ext-hot") != greedy  # the same seed and heat, without top_k
    assert _content(ext_job, "ext-top-k-1") == greedy


def test_repetition_penalty_changes_the_greedy_answer(ext_job: dict[str, Any]) -> None:
    assert _content(ext_job, "ext-repetition-penalty") != _content(ext_job, "ext-greedy")


def test_stop_strings_kept_with_include_stop_str_in_output(ext_job: dict[str, Any]) -> None:
    choice = _choice(ext_job, "ext-include-stop")
    assert choice.finish_reason == "stop"
    assert choice.message.content.endswith("6"), choice.message.content
    assert choice.message.content.count("6") == 1


def test_stop_token_ids_and_bad_words_keep_the_dot_out(ext_job: dict[str, Any]) -> None:
    greedy = _content(ext_job, "ext-greedy")
    assert greedy.startswith("1. 1\n")  # greedy, the model numbers its list: "1." is 1, then 30
    stopped = _choice(ext_job, "ext-stop-token-ids")
    assert stopped.finish_reason == "stop"
    # Generation ends at the first "." (token 30), which is not shown.
    assert stopped.message.content == greedy[: greedy.index(".")]
    banned = _content(ext_job, "ext-bad-words")
    assert "." not in banned and banned != greedy


def test_ignore_eos_and_min_tokens_make_the_answer_longer(ext_job: dict[str, Any]) -> None:
    plain = _tokens(ext_job, "ext-short")
    assert plain < 25  # the model ends its short answer by itself
    assert _choice(ext_job, "ext-short").finish_reason == "stop"
    assert _tokens(ext_job, "ext-ignore-eos") == 40
    assert _choice(ext_job, "ext-ignore-eos").finish_reason == "length"
    assert _tokens(ext_job, "ext-min-tokens") >= 25


def test_allowed_token_ids_leave_one_choice(ext_job: dict[str, Any]) -> None:
    assert _content(ext_job, "ext-allowed-token-ids") == ",,,,,"


def test_what_cannot_run_is_refused_naming_the_field(ext_job: dict[str, Any]) -> None:
    errors = ext_job["errors"]
    beam = errors["refused-beam-search"]
    assert beam["response"] is None  # an invalid line: validation refused it
    assert beam["error"]["message"] == (
        "body.use_beam_search is not supported: batchrun samples; it runs no beam search; remove it"
    )
    over = errors["refused-min-tokens-over-max"]
    assert over["response"] is None
    assert over["error"]["message"] == (
        "body.min_tokens 50 is more than the answer's limit of 10 tokens (max_tokens); lower it "
        "or raise max_tokens"
    )
    # The model's vocabulary decides, at validation: its size is in the model's config.json.
    vocab = errors["refused-allowed-token-out-of-vocab"]
    assert vocab["response"] is None
    assert vocab["error"]["message"] == (
        "body.allowed_token_ids names token id 10000000, outside this model's vocabulary "
        "(ids 0 to 49151)"
    )
