"""A media part the model cannot read is an error record at validation, before any engine starts,
when the model's config says what it reads (models/modalities.py); the worker's check stays the
backstop for the models batchrun cannot tell from their config."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.cli import cli
from support.lines import media_line, read_jsonl, write_jsonl
from support.media import default_media_policy
from testmodels.multimodal import png_bytes, wav_bytes

from batchrun.config import EngineSettings
from batchrun.models.modalities import config_modalities
from batchrun.openai.media import use_media_policy
from batchrun.openai.reader import read_input
from batchrun.openai.records import LineError, Request
from batchrun.run.media_options import media_policy_of

PNG_URL = "data:image/png;base64," + base64.b64encode(png_bytes(8, 8, (200, 30, 30))).decode()
WAV = base64.b64encode(wav_bytes(0.1, 440)).decode()
IMAGE = {"type": "image_url", "image_url": {"url": PNG_URL}}
AUDIO = {"type": "input_audio", "input_audio": {"data": WAV, "format": "wav"}}


def model_dir(tmp_path: Path, name: str, architecture: str) -> Path:
    """A model directory holding only a config.json (no weights: no engine could load it)."""
    path = tmp_path / name
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"architectures": [architecture]}))
    return path


@pytest.fixture(autouse=True)
def default_policy() -> Iterator[None]:
    """Each test starts and ends with the default policy (this process's reader uses it)."""
    yield from default_media_policy()


@pytest.mark.parametrize(
    ("architecture", "reads"),
    [
        ("LlamaForCausalLM", ("text",)),
        ("Qwen2ForCausalLM", ("text",)),
        ("Idefics3ForConditionalGeneration", ("text", "image")),
        ("Qwen2VLForConditionalGeneration", ("text", "image", "video")),
        ("WhisperForConditionalGeneration", ("text", "audio")),
        # Multimodal in vLLM's registry, but not in batchrun's table: the worker decides.
        ("AriaForConditionalGeneration", None),
        ("NoSuchModelForCausalLM", None),
    ],
)
def test_a_models_modalities_come_from_its_config(
    architecture: str, reads: tuple[str, ...] | None
) -> None:
    assert config_modalities({"architectures": [architecture]}) == reads


def test_a_config_without_architectures_is_not_known() -> None:
    assert config_modalities({"model_type": "llama"}) is None


def test_a_text_model_refuses_media_parts_before_any_engine_starts(tmp_path: Path) -> None:
    """A text-only model's job with image and audio lines: error records naming what the model
    reads, and no engine started (its directory has no weights, so one would have failed)."""
    model = model_dir(tmp_path, "textonly", "LlamaForCausalLM")
    src = write_jsonl(tmp_path / "in.jsonl", [media_line("img", IMAGE), media_line("aud", AUDIO)])
    job = tmp_path / "job"
    run = cli(
        "submit", str(src), "--job-dir", str(job), "--engine", "vllm", "--model", str(model),
        "--no-progress",
    )  # fmt: skip
    assert run.returncode == 1, run.stderr
    assert cli("export", "--job-dir", str(job)).returncode == 0
    errors = {
        r["custom_id"]: (r["error"]["code"], r["error"]["message"])
        for r in read_jsonl(job / "errors.jsonl")
    }
    where = "body.messages[0].content[1]"
    assert errors == {
        "img": (
            "invalid_media",
            f"{where}: a part of type 'image_url' needs a model that reads image; "
            "textonly reads text",
        ),
        "aud": (
            "invalid_media",
            f"{where}: a part of type 'input_audio' needs a model that reads audio; "
            "textonly reads text",
        ),
    }


def test_an_image_model_refuses_audio_and_takes_images(tmp_path: Path) -> None:
    """Idefics3 reads images: an image part passes, an audio part is refused naming
    'text, image'; the served name is the one the message gives."""
    model = model_dir(tmp_path, "idefics", "Idefics3ForConditionalGeneration")
    settings = EngineSettings(engine="vllm", model=str(model), served_model_name="tiny-vl")
    use_media_policy(media_policy_of(settings))
    lines = [media_line("img", IMAGE), media_line("aud", AUDIO)]
    src = write_jsonl(tmp_path / "in.jsonl", lines)
    assert list(read_input(src)) == [
        Request("img", 1, lines[0]["url"], lines[0]["body"]),
        LineError(
            2,
            "aud",
            "invalid_media",
            "body.messages[0].content[1]: a part of type 'input_audio' needs a model that reads "
            "audio; tiny-vl reads text, image",
        ),
    ]


def test_a_transcription_line_needs_a_model_that_reads_audio(tmp_path: Path) -> None:
    model = model_dir(tmp_path, "textonly", "LlamaForCausalLM")
    use_media_policy(media_policy_of(EngineSettings(engine="vllm", model=str(model))))
    line = {
        "custom_id": "t",
        "method": "POST",
        "url": "/v1/audio/transcriptions",
        "body": {"model": "m", "file_url": "data:audio/wav;base64," + WAV},
    }
    [err] = list(read_input(write_jsonl(tmp_path / "in.jsonl", [line])))
    assert err == LineError(
        1,
        "t",
        "invalid_request",
        "this line needs a speech-to-text model (such as Whisper); textonly reads text",
    )


def test_an_engine_that_loads_no_model_takes_any_part(tmp_path: Path) -> None:
    """The echo engine names a model but loads none: nothing is refused for what it reads."""
    model = model_dir(tmp_path, "textonly", "LlamaForCausalLM")
    use_media_policy(media_policy_of(EngineSettings(engine="echo", model=str(model))))
    [item] = list(read_input(write_jsonl(tmp_path / "in.jsonl", [media_line("img", IMAGE)])))
    assert isinstance(item, Request)


def test_a_job_of_several_models_leaves_the_check_to_each_models_worker(tmp_path: Path) -> None:
    """Which model reads a part depends on the line's body.model: the first model's modalities
    must not refuse a line meant for another (its worker checks instead)."""
    text = model_dir(tmp_path, "textonly", "LlamaForCausalLM")
    vision = model_dir(tmp_path, "idefics", "Idefics3ForConditionalGeneration")
    settings = EngineSettings(
        engine="vllm",
        model=str(text),
        models=[{"name": "t", "model": str(text)}, {"name": "v", "model": str(vision)}],
    )
    assert media_policy_of(settings).model_modalities is None
    assert media_policy_of(EngineSettings(engine="vllm", model=str(text))).model_modalities == (
        "text",
    )


def test_a_gguf_file_not_yet_converted_is_not_converted_to_learn_its_modalities(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The options are checked before the model is prepared: reading a GGUF model's modalities
    must not start its conversion (torch) in the journal's process; unknown until converted."""
    home = tmp_path / "home"
    monkeypatch.setenv("BATCHRUN_HOME", str(home))
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF" + b"\0" * 64)
    policy = media_policy_of(EngineSettings(engine="vllm", model=str(gguf)))
    assert (policy.model_modalities, policy.model_name) == (None, "model.gguf")
    assert not home.exists()
