"""vLLM's chat_template_kwargs: a chat request's own template variables (Qwen3's enable_thinking)
reach the chat template as vLLM's server passes them, over what reasoning_effort would set; the
names batchrun renders itself are refused. The default model's real tokenizer renders the prompts,
with tests/fixtures/thinking_chat_template.jinja (which reads enable_thinking and
reasoning_effort, as Qwen3's does)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.lines import write_jsonl
from support.models import default_model_dir
from support.paths import ROOT

from batchrun.engines.vllm.prompts import prompt_token_ids
from batchrun.openai.reader import read_input
from batchrun.openai.records import CHAT, LineError, Request

pytestmark = pytest.mark.slow  # a tokenizer loaded (and the default model converted once)

TEMPLATE = (ROOT / "tests" / "fixtures" / "thinking_chat_template.jinja").read_text()
OFF = "<|im_start|>assistant\n<think>\n\n</think>\n\n"  # the answer turn, thinking switched off
ON = "<|im_start|>assistant\n<think>\n"


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(default_model_dir()))
    tok.chat_template = TEMPLATE
    return tok


def rendered(tokenizer: Any, **body: Any) -> str:
    request = Request("a", 1, CHAT, {"messages": [{"role": "user", "content": "Hi"}], **body})
    ids = prompt_token_ids(tokenizer, request, template=TEMPLATE, model_name="m")
    return str(tokenizer.decode(ids))


def test_the_requests_template_variables_reach_the_template(tokenizer: Any) -> None:
    assert rendered(tokenizer).endswith(ON)
    assert rendered(tokenizer, chat_template_kwargs={"enable_thinking": False}).endswith(OFF)
    assert rendered(tokenizer, chat_template_kwargs={"enable_thinking": True}).endswith(ON)
    # A variable the template does not read changes nothing (as in vLLM).
    assert rendered(tokenizer, chat_template_kwargs={"unused": 1}) == rendered(tokenizer)


def test_the_requests_enable_thinking_wins_over_reasoning_effort(tokenizer: Any) -> None:
    # reasoning_effort alone switches thinking on unless it is "none" (as vLLM's server does)...
    assert rendered(tokenizer, reasoning_effort="low").endswith("(effort: low) <think>\n")
    assert rendered(tokenizer, reasoning_effort="none").endswith(
        OFF.replace("\n<think>", "\n(effort: none) <think>")
    )
    # ... but a request that says enable_thinking itself is taken at its word.
    both = rendered(
        tokenizer, reasoning_effort="high", chat_template_kwargs={"enable_thinking": False}
    )
    assert both.endswith("(effort: high) <think>\n\n</think>\n\n"), both


def _refusal(tmp_path: Path, **body: Any) -> str:
    line = {
        "custom_id": "a",
        "method": "POST",
        "url": CHAT,
        "body": {"model": "m", "messages": [{"role": "user", "content": "Hi"}], **body},
    }
    (out,) = read_input(write_jsonl(tmp_path / "in.jsonl", [line]))
    assert isinstance(out, LineError), out
    return out.message


def test_names_batchrun_renders_itself_are_refused(tmp_path: Path) -> None:
    assert _refusal(tmp_path, chat_template_kwargs={"tokenize": True}) == (
        "body.chat_template_kwargs.tokenize is not a template variable a request may set: "
        "batchrun renders the prompt with it itself; remove it"
    )
    assert _refusal(tmp_path, chat_template_kwargs={"tools": []}) == (
        "body.chat_template_kwargs.tools is not a template variable a request may set: "
        "batchrun renders the prompt with it itself; give tools as body.tools"
    )
    assert _refusal(tmp_path, chat_template_kwargs=["enable_thinking"]) == (
        "body.chat_template_kwargs must be an object of chat template variables such as "
        '{"enable_thinking": false}, got an array of 1 item'
    )
    assert _refusal(tmp_path, chat_template="{{ messages }}") == (
        "body.chat_template is not supported: a job renders with its model's chat template; "
        "remove it"
    )
    assert _refusal(tmp_path, continue_final_message=True) == (
        "body.continue_final_message is not supported: every answer starts a new assistant "
        "turn; remove it"
    )


def test_a_responses_request_passes_its_template_variables_too(tokenizer: Any) -> None:
    from batchrun.openai.records import RESPONSES

    def responses(**body: Any) -> str:
        request = Request("a", 1, RESPONSES, {"input": "Hi", **body})
        ids = prompt_token_ids(tokenizer, request, template=TEMPLATE, model_name="m")
        return str(tokenizer.decode(ids))

    assert responses().endswith(ON)
    assert responses(chat_template_kwargs={"enable_thinking": False}).endswith(OFF)
    effort = {"reasoning": {"effort": "low"}, "chat_template_kwargs": {"enable_thinking": False}}
    assert responses(**effort).endswith("(effort: low) <think>\n\n</think>\n\n")
