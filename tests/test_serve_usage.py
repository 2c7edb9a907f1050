"""A finished batch's usage details: cached and reasoning tokens summed over its answers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from batchrun.serve.usage import TokenDetails, token_details


def _line(cid: str, usage: dict[str, Any] | None) -> str:
    response = None if usage is None else {"status_code": 200, "body": {"usage": usage}}
    return json.dumps({"id": f"batch_req_{cid}", "custom_id": cid, "response": response})


def test_cached_and_reasoning_tokens_are_summed_over_every_kind_of_answer(tmp_path: Path) -> None:
    out = tmp_path / "output.jsonl"
    lines = [
        _line("chat", {"prompt_tokens": 300, "prompt_tokens_details": {"cached_tokens": 256},
                       "completion_tokens_details": {"reasoning_tokens": 7}}),
        _line("resp", {"input_tokens": 200, "input_tokens_details": {"cached_tokens": 128,
                       "cache_write_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 5}}),
        _line("echo", {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}),
        _line("score", {"prompt_tokens": 9, "prompt_tokens_details": None}),
        _line("failed", None),
        # A lone surrogate escape in an answer (json writes it; msgspec refuses it): still read.
        '{"custom_id": "sur", "response": {"body": {"text": "\\ud83d", "usage": '
        '{"prompt_tokens_details": {"cached_tokens": 16}}}}}',
    ]  # fmt: skip
    out.write_text("\n".join(lines) + "\n")
    found = token_details(out)
    assert found.reasoning_tokens == 12
    assert found.cached_tokens == 256 + 128 + 16
    assert token_details(tmp_path / "none.jsonl") == TokenDetails(0, 0)
