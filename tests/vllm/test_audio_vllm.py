"""Transcription lines end to end through vLLM on a tiny Whisper (tests/support/mm_jobs.py): answers equal
vLLM's own batch runner's, in OpenAI's transcription shape; bad audio is an error record."""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest
from support.lines import read_jsonl

pytestmark = pytest.mark.vllm


def test_transcriptions_equal_vllm_run_batch(vllm_audio_job: dict[str, Any]) -> None:
    """Each line (the samples, a file:// clip, a clip longer than the model's window, a
    max_completion_tokens cap, verbose_json) answered as `vllm.entrypoints.openai.run_batch`
    answers it: {"text", "usage": {"type": "duration", "seconds"}}, or vLLM's verbose object."""
    job = vllm_audio_job["job"]
    bodies = {r["custom_id"]: r["response"]["body"] for r in read_jsonl(job / "output.jsonl")}
    assert bodies == vllm_audio_job["raw"]
    assert set(bodies) == {
        "tone-440", "tone-880", "file", "long", "short-cap", "verbose", "verbose-long",
        "detect", "detect-verbose",
    }  # fmt: skip
    assert bodies["long"]["usage"] == {"type": "duration", "seconds": 7}
    plain = [b["text"] for cid, b in bodies.items() if "verbose" not in cid]
    assert len(set(plain)) == len(plain)
    verbose = bodies["verbose-long"]
    assert set(verbose) == {"duration", "language", "text", "segments", "words"}
    assert (verbose["duration"], verbose["language"]) == (7.0, "en") and verbose["segments"]
    # A line with no language: the model's own guess (random weights: any of its languages),
    # the same one vLLM's server detects.
    detected = bodies["detect-verbose"]["language"]
    assert isinstance(detected, str) and detected, bodies["detect-verbose"]


def test_results_parquet_holds_each_transcriptions_text_and_duration(
    vllm_audio_job: dict[str, Any],
) -> None:
    df = pd.read_parquet(vllm_audio_job["job"] / "results.parquet").set_index("custom_id")
    ok = df[df["status"] == "succeeded"]
    bodies = vllm_audio_job["raw"]
    assert ok["content"].to_dict() == {cid: b["text"] for cid, b in bodies.items()}
    assert ok["duration_s"].to_dict() == {
        cid: float(b["duration"] if "duration" in b else b["usage"]["seconds"])
        for cid, b in bodies.items()
    }


def test_bad_audio_is_an_error_record(vllm_audio_job: dict[str, Any]) -> None:
    job = vllm_audio_job["job"]
    errors = {e["custom_id"]: e["error"] for e in read_jsonl(job / "errors.jsonl")}
    assert {cid: e["code"] for cid, e in errors.items()} == vllm_audio_job["bad"]
    assert errors["not-audio"]["message"] == (
        "cannot decode the audio: Invalid or unsupported audio file."
    )
    assert errors["multipart"]["message"] == (
        "body.file is not supported in batch requests (there is no multipart upload); pass the "
        "audio as body.file_url: a data:audio/...;base64, URL, an http(s) URL or a file:// URL"
    )
    assert errors["srt"]["message"] == (
        "body.response_format 'srt' is not supported: vLLM answers json, text, verbose_json"
    )
    assert vllm_audio_job["submit"].returncode == 1
