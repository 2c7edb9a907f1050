"""The typed parameters every engine reads: OpenAI's defaults, null as "not set", one meaning."""

from __future__ import annotations

from typing import Any

import pytest

from batchrun.openai.params import OutputFormat, Sampling, embedding_params, sampling
from batchrun.openai.records import CHAT, COMPLETIONS, EMBEDDINGS, Request
from batchrun.openai.vllm_sampling import VllmSampling


def chat(**body: Any) -> Sampling:
    return sampling(
        Request("a", 1, CHAT, {"messages": [{"role": "user", "content": "hi"}], **body})
    )


def completion(**body: Any) -> Sampling:
    return sampling(Request("a", 1, COMPLETIONS, {"prompt": "hi", **body}))


def test_an_empty_chat_body_has_openai_defaults() -> None:
    assert chat() == Sampling()
    # JSON null on an optional field means "not set".
    assert chat(n=None, temperature=None, top_p=None, stop=None, seed=None) == Sampling()


def test_chat_max_completion_tokens_wins_over_max_tokens() -> None:
    assert chat(max_tokens=5).max_tokens == 5
    assert chat(max_tokens=5, max_completion_tokens=7).max_tokens == 7
    assert chat(max_tokens=5, max_completion_tokens=None).max_tokens == 5


def test_completions_generate_16_tokens_unless_told() -> None:
    assert completion().max_tokens == 16
    assert completion(max_tokens=3).max_tokens == 3
    assert completion(max_completion_tokens=3).max_tokens == 16  # a chat field, not read here


def test_logprobs_are_asked_differently_by_chat_and_completions() -> None:
    assert chat().logprobs is None
    assert chat(logprobs=False, top_logprobs=None).logprobs is None
    assert chat(logprobs=True).logprobs == 0
    assert chat(logprobs=True, top_logprobs=3).logprobs == 3
    assert completion().logprobs is None
    assert completion(logprobs=0).logprobs == 0
    assert completion(logprobs=2).logprobs == 2


def test_fields_are_typed() -> None:
    params = chat(
        n=2, temperature=0, top_p=1, seed=-5, stop="END", logit_bias={"50": 3, "7": -1.5},
        presence_penalty=1, frequency_penalty=-1,
    )  # fmt: skip
    assert params == Sampling(
        n=2, temperature=0.0, top_p=1.0, seed=-5, stop=("END",),
        logit_bias={50: 3.0, 7: -1.5}, presence_penalty=1.0, frequency_penalty=-1.0,
    )  # fmt: skip
    assert type(params.temperature) is float
    assert chat(stop=["a", "b"]).stop == ("a", "b")


def test_response_format_becomes_an_output_constraint() -> None:
    assert chat(response_format={"type": "text"}).output_format is None
    assert chat(response_format={"type": "json_object"}).output_format == OutputFormat(
        "json_object"
    )
    schema = {"type": "object", "properties": {"x": {"type": "integer"}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    assert chat(response_format=fmt).output_format == OutputFormat("json_schema", schema)
    no_schema = {"type": "json_schema", "json_schema": {"name": "x"}}
    assert chat(response_format=no_schema).output_format == OutputFormat("json_schema", None)


def test_tools_are_parsed_unless_tool_choice_is_none() -> None:
    tools = [{"type": "function", "function": {"name": "f"}}]
    assert chat(tools=tools).tools is True
    assert chat(tools=tools, tool_choice="auto").tools is True
    assert chat(tools=tools, tool_choice="none").tools is False
    assert chat(tools=[]).tools is False


def test_echo_is_a_completions_field() -> None:
    assert completion(echo=True).echo is True
    assert completion(echo=None).echo is False
    assert chat(echo=True).echo is False


def test_embedding_inputs_are_listed_one_per_item() -> None:
    def fields(value: Any, **body: Any) -> Any:
        return embedding_params(Request("a", 1, EMBEDDINGS, {"input": value, **body}))

    one = fields("hello")
    assert (one.inputs, one.single, one.dimensions, one.encoding_format) == (
        ["hello"], True, None, "float",
    )  # fmt: skip
    assert fields(["a", "b"]).inputs == ["a", "b"] and not fields(["a", "b"]).single
    assert fields([1, 2, 3]).inputs == [[1, 2, 3]]
    assert fields([[1], [2, 3]], dimensions=8, encoding_format="base64").inputs == [[1], [2, 3]]
    assert fields("x", dimensions=8, encoding_format="base64").dimensions == 8
    assert fields("x", encoding_format=None).encoding_format == "float"


def test_vllm_extensions_are_read_only_when_set() -> None:
    assert chat().vllm is None and completion(user="u").vllm is None
    got = chat(top_k=5, ignore_eos=True, stop_token_ids=[2], bad_words=["no"], min_p=0)
    assert got.vllm == VllmSampling(
        top_k=5, ignore_eos=True, stop_token_ids=(2,), bad_words=("no",), min_p=0.0
    )
    assert isinstance(got.vllm.min_p, float)
    # Null is "not set": vLLM's defaults.
    assert chat(top_k=None, skip_special_tokens=None).vllm == VllmSampling()
    assert completion(skip_special_tokens=False, allowed_token_ids=[3]).vllm == VllmSampling(
        skip_special_tokens=False, allowed_token_ids=(3,)
    )


def test_a_models_defaults_fill_only_the_fields_a_request_leaves_unset() -> None:
    from batchrun.engines.vllm.model_defaults import with_model_defaults

    defaults = {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05}
    body = {"messages": [{"role": "user", "content": "hi"}], "temperature": 0, "top_k": None}
    got = with_model_defaults(sampling(Request("a", 1, CHAT, body)), body, defaults)
    assert (got.temperature, got.top_p) == (0.0, 0.8)  # its own 0 kept; top_p the model's
    assert got.vllm == VllmSampling(top_k=20, repetition_penalty=1.05)  # null is unset
    assert isinstance(got.vllm.top_k, int)
    # A request that sets them all keeps them all; no defaults change nothing.
    full = {**body, "top_p": 1, "top_k": 5, "repetition_penalty": 1}
    mine = sampling(Request("a", 1, CHAT, full))
    assert with_model_defaults(mine, full, defaults) == mine
    assert with_model_defaults(mine, body, {}) is mine


@pytest.mark.parametrize(
    ("body", "field", "token"),
    [
        ({"logit_bias": {"5": 1, "100": 1}}, "logit_bias", 100),
        ({"allowed_token_ids": [5, 120]}, "allowed_token_ids", 120),
        ({"stop_token_ids": [5, 100]}, "stop_token_ids", 100),
    ],
)
def test_a_token_id_outside_the_vocabulary_is_one_400_in_one_form(
    body: dict[str, Any], field: str, token: int
) -> None:
    """Every field that names token ids is checked against the model's vocabulary the same way,
    before vLLM is asked (whose own words for stop_token_ids were its raw error text)."""
    from batchrun.engines.vllm.errors import BadRequest
    from batchrun.engines.vllm.params import sampling_params

    with pytest.raises(BadRequest) as refused:
        sampling_params(chat(max_tokens=4, **body), 3, max_model_len=64, vocab_size=100)
    assert (refused.value.code, refused.value.message) == (
        "invalid_request",
        f"body.{field} names token id {token}, outside this model's vocabulary (ids 0 to 99)",
    )
