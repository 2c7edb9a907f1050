"""/v1/responses and --reasoning-parser on the real engine: the responses job (a batch of the
generative server, tests/support/vllm_served.py), the default model with a test-only chat template that opens the assistant turn
in a think block, and vLLM's own qwen3 reasoning parser. Every answer parses as the openai
package's `Response`; the reasoning split is the one vLLM's parser makes of the model's text."""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest
from openai.types.responses import Response
from support.openai_checks import assert_no_extra, requests_of
from support.vllm_jobs import RESPONSES_REASONING, RESPONSES_SAMPLE, line_numbers
from support.vllm_served import finished_with

pytestmark = pytest.mark.vllm

REFUSED = {
    "refused-tools": "body.tools is not supported: tools are not run on /v1/responses; use "
    "/v1/chat/completions, where function tools and tool_choice are honoured; remove it",
    "refused-previous": "body.previous_response_id is not supported: a batch line stands "
    "alone: no response or conversation is stored to continue; remove it",
    "refused-image": "body.input[0].content[0].file_id is not supported: batchrun has no file "
    "store; give the image as image_url (a data:image/...;base64, URL, an http(s) URL or a "
    "file:// URL)",
}


def _responses(job: dict[str, Any]) -> dict[str, Response]:
    parsed = {}
    for cid, line in job["outputs"].items():
        assert line["response"]["status_code"] == 200 and line["error"] is None
        parsed[cid] = Response.model_validate(line["response"]["body"], strict=True)
        assert_no_extra(parsed[cid])
    return parsed


def test_every_line_answers_as_a_response_or_is_refused_naming_the_field(
    vllm_responses_job: dict[str, Any],
) -> None:
    job = vllm_responses_job
    finished_with(job, len(REFUSED))  # the refused lines fail, every other line is answered
    assert job["export"].returncode == 0 and job["parquet"].returncode == 0
    lines = line_numbers(job["src"])
    assert {
        cid: (e["error"]["message"], e["error"]["line"]) for cid, e in job["errors"].items()
    } == {cid: (message, lines[cid]) for cid, message in REFUSED.items()}
    requests = {
        **requests_of(RESPONSES_SAMPLE),
        **{r["custom_id"]: r["body"] for r in RESPONSES_REASONING},
    }
    answers = _responses(job)
    assert set(answers) == set(requests) - set(REFUSED)
    for cid, response in answers.items():
        request = requests[cid]
        assert response.object == "response" and response.model == "gpt-4o-mini"
        assert response.id.startswith("resp_")
        usage = response.usage
        assert usage is not None and usage.total_tokens == usage.input_tokens + usage.output_tokens
        assert usage.output_tokens <= request["max_output_tokens"]
        assert usage.output_tokens_details.reasoning_tokens <= usage.output_tokens
        # The prompt tokens vLLM found in its prefix cache (a count of the engine's, not 0 always).
        assert 0 <= usage.input_tokens_details.cached_tokens <= usage.input_tokens
        assert response.instructions == request.get("instructions")
        assert response.metadata == (request.get("metadata") or {})
        assert response.temperature == request.get("temperature", 1.0)
    cut = answers["cut"]
    assert cut.status == "incomplete" and cut.incomplete_details is not None
    assert cut.incomplete_details.reason == "max_output_tokens"
    assert cut.usage is not None and cut.usage.output_tokens == 5
    assert answers["json-schema"].text is not None
    assert answers["json-schema"].text.format.type == "json_schema"


def test_reasoning_is_split_off_as_vllms_qwen3_parser_splits_it(
    vllm_responses_job: dict[str, Any],
) -> None:
    from transformers import AutoTokenizer
    from vllm.reasoning import ReasoningParserManager

    answers = _responses(vllm_responses_job)
    shots = answers["think-shots"]
    reasoning, message = shots.output
    assert reasoning.type == "reasoning" and message.type == "message"
    assert reasoning.content is not None
    thought, answer = reasoning.content[0].text, shots.output_text
    assert "2 plus 2" in thought and "4" in answer
    # What vLLM's own parser makes of the model's text (the template opened the think block).
    tokenizer = AutoTokenizer.from_pretrained(str(vllm_responses_job["model"]))
    parser = ReasoningParserManager.get_reasoning_parser("qwen3")(tokenizer)
    raw = f"{thought}</think>{answer}"
    assert parser.extract_reasoning(raw, None) == (thought, answer)
    usage = shots.usage
    assert usage is not None
    assert 0 < usage.output_tokens_details.reasoning_tokens < usage.output_tokens
    # reasoning.effort reaches the template (it reads reasoning_effort and enable_thinking):
    # "none" closes the think block in the prompt, so the answer is all content.
    low, none = answers["think-low"], answers["think-none"]
    assert low.reasoning is not None and low.reasoning.effort == "low"
    assert low.output[0].type == "reasoning"
    assert [item.type for item in none.output] == ["message"]
    assert none.usage is not None and none.usage.output_tokens_details.reasoning_tokens == 0
    assert none.output_text


def test_parquet_has_the_reasoning_column(vllm_responses_job: dict[str, Any]) -> None:
    df = pd.read_parquet(vllm_responses_job["job"] / "results.parquet").set_index("custom_id")
    answers = _responses(vllm_responses_job)
    shots = answers["think-shots"]
    assert df.loc["think-shots", "reasoning"] == shots.output[0].content[0].text  # type: ignore[union-attr]
    assert df.loc["think-shots", "content"] == shots.output_text
    assert df.loc["think-shots", "completion_tokens"] == shots.usage.output_tokens  # type: ignore[union-attr]
    assert pd.isna(df.loc["think-none", "reasoning"])
    assert df.loc["cut", "finish_reason"] == "length"
    assert df.loc["refused-tools", "status"] == "invalid"
