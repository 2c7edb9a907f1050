"""results.parquet rows of transcription and translation lines: the text as `content`, and a
`duration_s` column where the answers report their audio's duration (echo engine: its
transcription answers carry a usage of 0 seconds, its translations none)."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pandas as pd
from support.cli import cli
from support.jobs import submit_echo
from support.lines import request_line, write_jsonl
from testmodels.multimodal import wav_bytes

WAV_URL = "data:audio/wav;base64," + base64.b64encode(wav_bytes(0.1, 440)).decode()


def audio_line(cid: str, url: str, **body: Any) -> dict[str, Any]:
    """A speech-to-text line in vLLM's batch format."""
    return request_line(cid, url, {"model": "w", "file_url": WAV_URL, **body})


def _export(tmp_path: Path, lines: list[dict[str, Any]]) -> pd.DataFrame:
    src = write_jsonl(tmp_path / "in.jsonl", lines)
    job = tmp_path / "job"
    run = submit_echo(src, job)
    assert run.returncode == 0, run.stderr
    assert cli("export", "--job-dir", str(job), "--parquet").returncode == 0
    return pd.read_parquet(job / "results.parquet").set_index("custom_id")


def test_a_transcription_row_holds_its_text_and_duration(tmp_path: Path) -> None:
    url = "/v1/audio/transcriptions"
    df = _export(
        tmp_path,
        [
            audio_line("a", url, prompt="a tone"),
            audio_line("b", url, prompt="another", response_format="text"),
        ],
    )
    assert df["content"].to_dict() == {"a": "a tone", "b": "another"}
    assert df["duration_s"].to_dict() == {"a": 0.0, "b": 0.0}
    assert str(df["duration_s"].dtype) == "float64"


def test_a_translation_job_has_no_duration_column(tmp_path: Path) -> None:
    """A translation's answer in json reports no duration (OpenAI's and vLLM's shape)."""
    df = _export(tmp_path, [audio_line("a", "/v1/audio/translations", prompt="a tone")])
    assert df.loc["a", "content"] == "a tone"
    assert "duration_s" not in df.columns


def test_a_text_job_has_no_duration_column(tmp_path: Path) -> None:
    line = {
        "custom_id": "c",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    }
    assert "duration_s" not in _export(tmp_path, [line]).columns
