"""--reasoning-parser: vLLM's own reasoning parsers split an answer into reasoning and content.

The parser is vLLM's class for the name (vllm/reasoning, ReasoningParserManager), built as vLLM's
server builds it (with the tokenizer, the model config and the request's chat template inputs,
which tell e.g. Qwen3's parser whether thinking was switched off), and read the way the server
reads a finished answer: `extract_reasoning` on the text, `count_reasoning_tokens` on the token
ids (usage.completion_tokens_details.reasoning_tokens).

vLLM's server builds a parser per request; building one costs ~25 ms here (the vocabulary is
read), so one is kept per set of template inputs instead: a finished answer's extraction resets
the parser's state first, so reusing it changes nothing.
"""

from __future__ import annotations

import json
from typing import Any

from batchrun.engines.names_cache import build_key, cached_names


class ReasoningParserError(ValueError):
    """--reasoning-parser names no parser of vLLM's, or one that cannot read this model."""


def parser_names() -> list[str]:
    """The names of vLLM's reasoning parsers, remembered per vLLM build (engines/names_cache.py:
    listing them imports vLLM, seconds before a command can refuse or start a job)."""
    key = build_key("vllm", "reasoning", "vllm.general_plugins")
    return cached_names("vllm reasoning parsers", key, _registered_parsers)


def _registered_parsers() -> list[str]:
    from vllm.reasoning import ReasoningParserManager

    return sorted(ReasoningParserManager.list_registered())


def check_parser_name(name: str) -> None:
    """Refuse a name that is not one of vLLM's reasoning parsers, listing them."""
    names = parser_names()
    if name not in names:
        raise ReasoningParserError(
            f"--reasoning-parser {name!r} is not one of vLLM's reasoning parsers: "
            f"{', '.join(names)}"
        )


class Reasoner:
    """One engine's reasoning parser (vLLM's), shared by its requests."""

    def __init__(self, name: str, tokenizer: Any, model_config: Any) -> None:
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
        from vllm.reasoning import ReasoningParserManager

        check_parser_name(name)
        self.name = name
        self._cls: Any = ReasoningParserManager.get_reasoning_parser(name)
        self._tokenizer = tokenizer
        self._model_config = model_config
        # What the parsers may read of the request (e.g. skip_special_tokens): vLLM's defaults.
        self._request = ChatCompletionRequest.model_construct(messages=[], model=name)
        self._parsers: dict[str, Any] = {}
        self._parser({})  # a parser that cannot read this tokenizer fails the start, not a request

    def _parser(self, kwargs: dict[str, Any]) -> Any:
        key = json.dumps(kwargs, sort_keys=True, default=str)
        parser = self._parsers.get(key)
        if parser is None:
            try:
                parser = self._cls(
                    self._tokenizer, chat_template_kwargs=kwargs, model_config=self._model_config
                )
            except (RuntimeError, ValueError, NotImplementedError) as exc:
                raise ReasoningParserError(
                    f"--reasoning-parser {self.name} cannot read this model's output: {exc}"
                ) from exc
            self._parsers[key] = parser
        return parser

    def split(
        self, text: str, token_ids: list[int], template_kwargs: dict[str, Any]
    ) -> tuple[str | None, str, int]:
        """The answer's reasoning (None when it has none), its content, and its reasoning
        tokens. `template_kwargs`: the chat template inputs the prompt was rendered with."""
        # Only the inputs a parser may read: tools are large and no reasoning parser looks.
        kwargs = {k: v for k, v in template_kwargs.items() if k != "tools"}
        parser = self._parser(kwargs)
        reasoning, content = parser.extract_reasoning(text, self._request)
        count = int(parser.count_reasoning_tokens(token_ids)) if token_ids else 0
        return reasoning, content or "", count
