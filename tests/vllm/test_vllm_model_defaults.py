"""A model's own sampling defaults (generation_config.json) on the real engine: what a request
leaves unset takes them, as vLLM's server applies them; what it sets is its own. The model is the
default one with temperature 0 and max_new_tokens 7 added to its generation config (1 start)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support.cli import cli
from support.lines import chat_line, write_jsonl
from support.models import default_model_with

pytestmark = pytest.mark.vllm

PROMPT = "Count from 1 to 20 separated by commas."


def model_with_defaults(tmp: Path, defaults: dict[str, Any]) -> Path:
    """The default model, its generation config given `defaults` (every other file linked)."""
    model, source = default_model_with(tmp, "model-with-defaults", "generation_config.json")
    config = json.loads((source / "generation_config.json").read_text())
    (model / "generation_config.json").write_text(json.dumps({**config, **defaults}))
    return model


def test_the_models_defaults_fill_what_a_request_leaves_unset(tmp_path: Path) -> None:
    model = model_with_defaults(tmp_path, {"temperature": 0.0, "max_new_tokens": 7})
    src = write_jsonl(
        tmp_path / "in.jsonl",
        [
            chat_line("unset", PROMPT),
            chat_line("unset-null", PROMPT, temperature=None, max_tokens=None),
            chat_line("greedy-12", PROMPT, temperature=0, max_tokens=12),
            chat_line("hot-12", PROMPT, temperature=1.5, seed=7, max_tokens=12),
        ],
    )
    job = tmp_path / "job"
    r = cli(
        "submit", str(src), "--job-dir", str(job), "--model", str(model), "--batch-size", "4",
        "--no-progress", timeout=400,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert (
        "the model's generation config sets what a request leaves unset, as vLLM's server does: "
        "temperature 0, max_tokens 7"
    ) in r.stderr
    assert cli("export", "--job-dir", str(job)).returncode == 0
    bodies = {
        out["custom_id"]: out["response"]["body"]
        for out in map(json.loads, (job / "output.jsonl").read_text().splitlines())
    }

    def text(cid: str) -> str:
        return str(bodies[cid]["choices"][0]["message"]["content"])

    # Unset (or null): the model's temperature 0 and its 7 tokens.
    for cid in ("unset", "unset-null"):
        assert bodies[cid]["usage"]["completion_tokens"] == 7, bodies[cid]
        assert bodies[cid]["choices"][0]["finish_reason"] == "length"
        assert text("greedy-12").startswith(text(cid)) and text(cid), (text(cid), text("greedy-12"))
    # Set: the request's own.
    assert bodies["greedy-12"]["usage"]["completion_tokens"] == 12
    assert text("hot-12") != text("greedy-12")
