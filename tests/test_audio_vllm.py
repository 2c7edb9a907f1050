"""Transcription lines end to end through vLLM on a tiny Whisper (tests/mm_jobs.py): answers equal
vLLM's own batch runner's, in OpenAI's transcription shape; bad audio is an error record."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import read_jsonl

pytestmark = pytest.mark.vllm


def test_transcriptions_equal_vllm_run_batch(vllm_audio_job: dict[str, Any]) -> None:
    """Each line (the samples, a file:// clip, a clip longer than the model's window, a
    max_completion_tokens cap) answered as `vllm.entrypoints.openai.run_batch` answers it:
    {"text", "usage": {"type": "duration", "seconds"}}."""
    job = vllm_audio_job["job"]
    bodies = {r["custom_id"]: r["response"]["body"] for r in read_jsonl(job / "output.jsonl")}
    assert bodies == vllm_audio_job["raw"]
    assert set(bodies) == {"tone-440", "tone-880", "file", "long", "short-cap"}
    assert bodies["long"]["usage"] == {"type": "duration", "seconds": 7}
    assert len({b["text"] for b in bodies.values()}) == len(bodies)


def test_bad_audio_is_an_error_record(vllm_audio_job: dict[str, Any]) -> None:
    job = vllm_audio_job["job"]
    errors = {e["custom_id"]: e["error"] for e in read_jsonl(job / "errors.jsonl")}
    assert {cid: e["code"] for cid, e in errors.items()} == vllm_audio_job["bad"]
    assert errors["not-audio"]["message"] == (
        "cannot decode the audio: Invalid or unsupported audio file."
    )
    assert errors["multipart"]["message"] == (
        "body.file is not supported in batch requests (there is no multipart upload); pass the "
        "audio as body.file_url: a data:audio/...;base64, URL or an http(s) URL"
    )
    assert errors["verbose"]["message"] == (
        "body.response_format 'verbose_json' is not supported by batchrun yet; use json or text"
    )
    assert errors["no-language"]["message"] == (
        'body.language is missing: this model needs the spoken language (such as "en"); '
        "batchrun does not detect it yet"
    )
    assert vllm_audio_job["submit"].returncode == 1
