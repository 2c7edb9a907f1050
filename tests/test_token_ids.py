"""Token ids a line names (logit_bias, allowed_token_ids, stop_token_ids) checked against its
model's vocabulary at validation (openai/token_ids.py), in the form the engine uses, with the
sizes fixed in the job's manifest for every later read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from batchrun.config import EngineSettings
from batchrun.job.manifest import Manifest
from batchrun.models.config_file import vocab_size
from batchrun.openai.reader import read_input
from batchrun.openai.records import CHAT, LineError, Request
from batchrun.openai.routing import KnownModels
from batchrun.openai.token_ids import Vocabularies
from batchrun.run.model_routes import job_vocabularies, vocabularies


def _line(cid: str, **body: Any) -> dict[str, Any]:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **body}
    return {"custom_id": cid, "method": "POST", "url": CHAT, "body": body}


def _read(tmp_path: Path, lines: list[dict[str, Any]], vocab: Vocabularies | None) -> list[Any]:
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    known = vocab.known if vocab is not None else None
    return list(read_input(path, known, vocab))


@pytest.mark.parametrize(
    ("field", "value", "token"),
    [
        ("stop_token_ids", [5, 100], 100),
        ("allowed_token_ids", [100000], 100000),
        ("logit_bias", {"7": 1, "250": -5}, 250),
    ],
)
def test_a_token_id_outside_the_vocabulary_is_an_invalid_line(
    tmp_path: Path, field: str, value: object, token: int
) -> None:
    lines = [_line("ok", **{field: [99] if field != "logit_bias" else {"99": 1}})]
    lines.append(_line("bad", **{field: value}))
    items = _read(tmp_path, lines, Vocabularies({"m": 100}))
    assert isinstance(items[0], Request) and items[0].custom_id == "ok"
    assert items[1] == LineError(
        2,
        "bad",
        "invalid_request",
        f"body.{field} names token id {token}, outside this model's vocabulary (ids 0 to 99)",
    )


def test_without_the_sizes_the_line_is_valid_and_left_to_the_engine(tmp_path: Path) -> None:
    items = _read(tmp_path, [_line("r", stop_token_ids=[10**9])], None)
    assert [type(x) for x in items] == [Request]


def test_each_line_is_checked_against_its_own_models_vocabulary(tmp_path: Path) -> None:
    known = KnownModels("big", ("lora",), others=("small",), adapter_bases=(("lora", "small"),))
    vocab = Vocabularies({"big": 1000, "small": 50}, known)
    lines = [
        {**_line("big"), "body": {**_line("x")["body"], "model": "big", "stop_token_ids": [60]}},
        {
            **_line("small"),
            "body": {**_line("x")["body"], "model": "small", "stop_token_ids": [60]},
        },
        {**_line("lora"), "body": {**_line("x")["body"], "model": "lora", "stop_token_ids": [60]}},
    ]
    items = _read(tmp_path, lines, vocab)
    assert isinstance(items[0], Request)
    assert [x.custom_id for x in items if isinstance(x, LineError)] == ["small", "lora"]


def test_a_model_of_unknown_size_is_not_checked(tmp_path: Path) -> None:
    known = KnownModels("big", others=("gguf",))
    vocab = Vocabularies({"big": 10}, known)
    line = _line("g")
    line["body"].update(model="gguf", stop_token_ids=[60])
    assert [type(x) for x in _read(tmp_path, [line], vocab)] == [Request]


def test_the_sizes_come_from_the_models_config_and_stay_with_the_job(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"text_config": {"vocab_size": 321}}))
    settings = EngineSettings(engine="vllm", model=str(model))
    settings.model_name = "model"
    assert vocab_size(settings) == 321  # a multimodal model's text vocabulary, as vLLM reads it
    found = vocabularies(settings)
    assert found is not None and dict(found.sizes) == {"model": 321}
    # A resume reads them from the manifest, with the names the job was submitted with.
    manifest = Manifest(
        job_id="j",
        created_at=0.0,
        input_path="x",
        input_sha256="",
        input_bytes=0,
        requests=1,
        invalid=0,
        engine=settings.to_dict(),
    )
    assert job_vocabularies(manifest) is None  # a job from before: nothing checked at reading
    manifest.vocab_sizes = dict(found.sizes)
    again = job_vocabularies(manifest)
    assert again is not None and again.refusal({"stop_token_ids": [321]}) is not None
    assert again.refusal({"stop_token_ids": [320]}) is None


def test_an_engine_that_loads_no_model_has_no_sizes() -> None:
    assert vocabularies(EngineSettings(engine="echo")) is None
