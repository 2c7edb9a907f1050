"""`batchrun serve` takes media lines as submit does: an upload of chat lines with images and
audio becomes a batch that completes on the echo engine, its bad media lines error records
naming the cause; /v1/models shows what the model reads."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.lines import media_line, write_jsonl
from support.serving import create_batch, lines_of, start_server, stop_server, wait_done
from testmodels.multimodal import png_bytes, wav_bytes

pytestmark = pytest.mark.slow  # out of the fast tier: docs/development.md

PNG_URL = "data:image/png;base64," + base64.b64encode(png_bytes(8, 8, (200, 30, 30))).decode()
WAV = base64.b64encode(wav_bytes(0.1, 440)).decode()
WHERE = "body.messages[0].content[1]"


def image(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def test_a_batch_of_media_lines_completes_with_its_bad_lines_as_errors(tmp_path: Path) -> None:
    root = tmp_path / "media"
    root.mkdir()
    (root / "red.png").write_bytes(png_bytes(4, 4, (10, 200, 10)))
    lines = [
        media_line("image", image(PNG_URL), "Caption it."),
        media_line(
            "audio",
            {"type": "input_audio", "input_audio": {"data": WAV, "format": "wav"}},
            "Transcribe it.",
        ),
        media_line("file", image((root / "red.png").as_uri()), "A local file."),
        media_line("corrupt", image("data:image/png;base64,iVBOR$w0K")),
        media_line("outside", image((tmp_path / "elsewhere.png").as_uri())),
    ]
    server = start_server(tmp_path / "root", "--allowed-local-media-path", str(root))
    try:
        client = server.client()
        batch = create_batch(client, write_jsonl(tmp_path / "in.jsonl", lines))
        done = wait_done(client, batch.id)
        assert done.status == "completed"
        assert done.request_counts is not None
        assert (done.request_counts.completed, done.request_counts.failed) == (3, 2)
        answers = {
            r["custom_id"]: r["response"]["body"]["choices"][0]["message"]["content"]
            for r in lines_of(client, done.output_file_id)
        }
        assert answers == {
            "image": "Caption it.",
            "audio": "Transcribe it.",
            "file": "A local file.",
        }
        errors = {
            r["custom_id"]: (r["error"]["code"], r["error"]["message"], r["error"]["line"])
            for r in lines_of(client, done.error_file_id)
        }
        url = f"{WHERE}.image_url.url"
        assert errors == {
            "corrupt": (
                "invalid_media",
                f"{url} is not valid base64: '$' at character 27 is not a base64 digit",
                4,
            ),
            "outside": (
                "invalid_media",
                f"{url}: {tmp_path / 'elsewhere.png'} is not under --allowed-local-media-path "
                f"{root}",
                5,
            ),
        }
    finally:
        stop_server(server)


def test_v1_models_shows_what_the_model_reads(tmp_path: Path) -> None:
    """Known from the model's config.json: no engine starts to list it (the directory has no
    weights). An adapter reads what its base model reads."""
    model = tmp_path / "vision"
    model.mkdir()
    (model / "config.json").write_text(
        json.dumps({"architectures": ["Idefics3ForConditionalGeneration"]})
    )
    server = start_server(
        tmp_path / "root", "--model", str(model), "--served-model-name", "tiny-vl", engine="vllm"
    )
    try:
        answer = httpx.get(f"{server.url}/v1/models", timeout=10)
        assert answer.status_code == 200, answer.text
        # The openai package's own client reads the entries, the extra field kept.
        [listed] = server.client().models.list().data
    finally:
        stop_server(server)
    [entry] = answer.json()["data"]
    assert (entry["id"], entry["modalities"]) == ("tiny-vl", ["text", "image"])
    assert listed.model_extra == {
        "root": str(model),
        "parent": None,
        "modalities": ["text", "image"],
    }


def test_v1_models_leaves_modalities_out_where_no_model_is_loaded(tmp_path: Path) -> None:
    """The echo engine reads any part and loads no model: its entry names no modalities."""
    server = start_server(tmp_path / "root")
    try:
        answer = httpx.get(f"{server.url}/v1/models", timeout=10)
    finally:
        stop_server(server)
    [entry] = answer.json()["data"]
    assert "modalities" not in entry
