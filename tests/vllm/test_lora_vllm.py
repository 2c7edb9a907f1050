"""LoRA adapters on the real engine: one job with two adapters and base lines mixed in one engine
batch, its answers equal to raw vLLM's (`LLM.chat` with the same LoRARequest, text-exact at
temperature 0), each group run there on its own so that the reference never meets vLLM's CPU bug.

Two engine starts: the job's, and the raw reference's (a child process).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest
from support.cli import cli
from support.lines import chat_line, read_jsonl, write_jsonl
from support.paths import ROOT
from support.reference import reference_run
from testmodels.lora import make_adapter

pytestmark = pytest.mark.vllm

BASE = "SmolLM2-135M-Instruct"
PROMPTS = [
    "What is the capital of France?",
    "Name a fruit.",
    "Say hello to a friend.",
    "What is 2 plus 2?",
]
# (custom_id, body.model or None, prompt): base and adapter lines interleaved, as a real file
# mixes them; all of them fit one engine batch, so the base lines share it with adapter lines.
LINES: list[tuple[str, str | None, str]] = [
    (f"{who}-{i}", model, prompt)
    for i, prompt in enumerate(PROMPTS)
    for who, model in (("base", None), ("a1", "a1"), ("named", BASE), ("a2", "a2"))
]


@pytest.fixture(scope="module")
def lora_job(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The job (two adapters, --max-loras 2: every slot filled, the CPU bug's set-up) and raw
    vLLM's answers for the same prompts."""
    tmp = tmp_path_factory.mktemp("lora")
    adapters = {
        "a1": str(make_adapter(tmp / "a1", seed=1)),
        "a2": str(make_adapter(tmp / "a2", seed=2)),
    }
    lines = []
    for cid, model, prompt in LINES:
        line = chat_line(cid, prompt, max_tokens=12, temperature=0)
        if model is None:
            del line["body"]["model"]
        else:
            line["body"]["model"] = model
        lines.append(line)
    lines.append(chat_line("unknown", "Hi.", model="a3", max_tokens=4))
    src = write_jsonl(tmp / "in.jsonl", lines)
    job = tmp / "job"
    from batchrun.models import default_model_dir

    work: dict[str, list[str]] = {"": PROMPTS, "a1": PROMPTS, "a2": PROMPTS}
    # Raw vLLM runs beside the job (see tests/conftest.py, reference_run).
    raw = reference_run(
        [
            sys.executable,
            str(ROOT / "scripts" / "testmodels" / "lora.py"),
            str(default_model_dir()),  # converted here, before either uses it
            json.dumps(adapters),
            json.dumps(work),
        ],
        tmp / "raw.log",
    )
    with raw as finish_raw:
        r = cli(
            "submit",
            str(src),
            "--job-dir",
            str(job),
            "--lora-modules",
            f"a1={adapters['a1']}",
            "--lora-modules",
            json.dumps({"name": "a2", "path": adapters["a2"], "base_model_name": BASE}),
            "--max-loras",
            "2",
            "--max-lora-rank",
            "8",
            "--dtype",
            "float32",
            "--batch-size",
            "32",
            "--no-progress",
        )
        assert r.returncode == 1, r.stderr  # the unknown model's line
        assert cli("export", "--job-dir", str(job)).returncode == 0
        stdout = finish_raw()
    [answers] = [x for x in stdout.splitlines() if x.startswith("RAW ")]
    reference = json.loads(answers[len("RAW ") :])
    return {
        "job": job,
        "output": {o["custom_id"]: o for o in read_jsonl(job / "output.jsonl")},
        "errors": read_jsonl(job / "errors.jsonl"),
        "raw": reference,
    }


def _text(output: dict[str, Any]) -> str:
    content: str = output["response"]["body"]["choices"][0]["message"]["content"]
    return content


def test_every_base_line_gets_the_base_models_answer_in_a_mixed_batch(
    lora_job: dict[str, Any],
) -> None:
    out, raw = lora_job["output"], lora_job["raw"]
    for i in range(len(PROMPTS)):
        assert _text(out[f"base-{i}"]) == raw[""][i]
        assert _text(out[f"named-{i}"]) == raw[""][i]


def test_adapter_lines_get_their_adapters_answer(lora_job: dict[str, Any]) -> None:
    out, raw = lora_job["output"], lora_job["raw"]
    for name in ("a1", "a2"):
        assert [_text(out[f"{name}-{i}"]) for i in range(len(PROMPTS))] == raw[name]
    # The adapters change the answers: a test that could not tell them apart proves nothing.
    for i in range(len(PROMPTS)):
        assert len({raw[""][i], raw["a1"][i], raw["a2"][i]}) == 3


def test_the_response_model_is_the_name_the_line_asked_for(lora_job: dict[str, Any]) -> None:
    models = {cid: o["response"]["body"]["model"] for cid, o in lora_job["output"].items()}
    assert models == {cid: model or BASE for cid, model, _ in LINES}


def test_an_unknown_model_is_an_error_record_listing_the_known_names(
    lora_job: dict[str, Any],
) -> None:
    [error] = lora_job["errors"]
    assert error["custom_id"] == "unknown"
    assert error["error"] == {
        "code": "model_not_found",
        "message": f"body.model 'a3' is no model of this job; known: {BASE} (the base model), "
        "a1, a2",
        "line": len(LINES) + 1,
    }
