"""The real-engine multimodal jobs the tests share (conftest.py makes each a session fixture):
the tiny models built once per session (scripts/testmodels/multimodal.py), and the image job on the tiny
Idefics3: sample_data/images.jsonl, then lines with images of their own (file://, http from a
server on 127.0.0.1, data URLs), then media only the worker finds bad. The job is SIGKILLed once
results are in the journal and resumed; raw vLLM's `LLM.chat` answers the same messages in a
process of its own, running beside the job, for the tests to compare.

Engine starts: the image job's submit and resume (2), raw vLLM (1). The audio job on the tiny
Whisper: sample_data/transcriptions.jsonl, a file:// clip, a clip longer than the model's window,
bad audio; vLLM's own batch runner (`python -m vllm.entrypoints.openai.run_batch`) answers the same
lines for the tests to compare, beside batchrun's job (1 start each).
"""

from __future__ import annotations

import base64
import fcntl
import http.server
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from testmodels.multimodal import png_bytes, wav_bytes

from support.cli import cli, start_cli
from support.jobs import journal_records
from support.lines import write_jsonl
from support.paths import ROOT
from support.reference import reference_run
from support.waits import wait_until

SAMPLES = ROOT / "sample_data"
IMAGE_SAMPLE = SAMPLES / "images.jsonl"
TRANSCRIPTION_SAMPLE = SAMPLES / "transcriptions.jsonl"
IMAGE_MODEL = "tiny-idefics3"
AUDIO_MODEL = "tiny-whisper"


def build_tiny_models(cache: Path) -> dict[str, Path]:
    """The tiny Idefics3 and Whisper, built once for the run (a process of its own, so that torch
    stays out of the test process). They go beside the converted models, which every test
    process of the run shares (conftest.py): the first process to need them builds them under a
    lock, the others find them built."""
    root = cache / "models" / "tiny-models"
    models = {"image": root / "idefics3", "audio": root / "whisper"}
    done = root / "built"
    root.mkdir(parents=True, exist_ok=True)
    with (root.parent / "tiny-models.lock").open("a") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        if not done.exists():
            built = subprocess.run(
                [sys.executable, str(ROOT / "scripts" / "testmodels" / "multimodal.py"), str(root)],
                capture_output=True,
                text=True,
                cwd=ROOT,
            )
            assert built.returncode == 0, built.stderr[-3000:]
            done.touch()
    return models


def data_url(data: bytes, mime: str) -> str:
    """A base64 data URL."""
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def image_chat(cid: str, parts: list[dict[str, Any]], max_tokens: int) -> dict[str, Any]:
    """A greedy chat line with content parts."""
    return {
        "custom_id": cid,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {
            "model": IMAGE_MODEL,
            "messages": [{"role": "user", "content": parts}],
            "temperature": 0,
            "max_tokens": max_tokens,
        },
    }


def _image(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def _text(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


def serve_dir(root: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    """An http server on 127.0.0.1 serving `root` (404 for what it lacks), and its base URL."""

    def handler(*args: Any) -> _Quiet:
        return _Quiet(*args, directory=str(root))

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def image_lines(media: Path, base_url: str) -> tuple[list[Any], dict[str, str]]:
    """The image job's lines, and the bad ones' expected error codes by custom_id."""
    lines: list[Any] = [json.loads(x) for x in IMAGE_SAMPLE.read_text().splitlines() if x.strip()]
    # Lines enough (each with its own image, 48 tokens) that a SIGKILL lands mid-job.
    for i in range(16):
        color = (40 + 12 * i, 200 - 9 * i, (70 * i) % 256)
        png = png_bytes(32 + 4 * i, 40, color, stripe=1 + i % 5)
        lines.append(
            image_chat(
                f"own-{i:02d}", [_text(f"Image {i}:"), _image(data_url(png, "image/png"))], 48
            )
        )
    (media / "local.png").write_bytes(png_bytes(64, 32, (250, 250, 0), stripe=3))
    (media / "served.png").write_bytes(png_bytes(40, 40, (0, 120, 120), stripe=2))
    lines.append(image_chat("file", [_text("Describe"), _image((media / "local.png").as_uri())], 8))
    lines.append(image_chat("http", [_text("Describe"), _image(f"{base_url}/served.png")], 8))
    bad = {
        # Found by the worker (vLLM's own reading of the media): error records of their own.
        "not-an-image": data_url(b"this is not a PNG at all", "image/png"),
        "http-404": f"{base_url}/missing.png",
        # Found at validation.
        "corrupt-base64": "data:image/png;base64,iVBO!!w0K",
        "outside-root": (ROOT / "sample_data" / "media" / "red.png").as_uri(),
    }
    for cid, url in bad.items():
        lines.append(image_chat(cid, [_text("Describe"), _image(url)], 8))
    wav = data_url(wav_bytes(0.2, 440), "audio/wav")
    lines.append(
        image_chat(
            "audio-to-image-model",
            [
                _text("Hear"),
                {
                    "type": "input_audio",
                    "input_audio": {"data": wav.split(",")[1], "format": "wav"},
                },
            ],
            8,
        )
    )
    return lines, {c: "invalid_media" for c in [*bad, "audio-to-image-model"]}


def run_image_job(tmp: Path, models: dict[str, Path]) -> dict[str, Any]:
    """The image job: submitted, SIGKILLed once results are in, resumed, exported; and raw
    vLLM's answers to the lines that have an answer."""
    media = tmp / "media"
    media.mkdir()
    server, base_url = serve_dir(media)
    try:
        lines, bad = image_lines(media, base_url)
        src = write_jsonl(tmp / "images.jsonl", lines)
        job = tmp / "job"
        args = [
            "--model", str(models["image"]), "--dtype", "float32", "--batch-size", "2",
            "--allowed-local-media-path", str(media), "--no-progress",
            "--gpu-memory-utilization", "0.1",
        ]  # fmt: skip
        good = [x for x in lines if x["custom_id"] not in bad]
        raw_in = write_jsonl(
            tmp / "raw.jsonl",
            [
                {
                    "custom_id": x["custom_id"],
                    "messages": x["body"]["messages"],
                    "max_tokens": x["body"].get("max_tokens") or x["body"]["max_completion_tokens"],
                }
                for x in good
            ],
        )
        raw_out = tmp / "raw-answers.json"
        # Raw vLLM runs beside batchrun's job, not after it: an engine start is mostly one
        # process importing and loading, which leaves a core to the other (the suite's time).
        raw = reference_run(
            [sys.executable, str(ROOT / "scripts" / "testmodels" / "multimodal.py"), "raw-chat",
             str(models["image"]), str(raw_in), str(raw_out), str(media)],
            tmp / "raw.log",
        )  # fmt: skip
        with raw as finish_raw:
            proc = start_cli("submit", str(src), "--job-dir", str(job), *args)

            def results() -> int:
                if not (job / "journal.jsonl").exists():
                    return 0
                return sum(r.get("kind") == "result" for r in journal_records(job))

            wait_until(lambda: results() >= 3, "the image job has answered 3 lines", timeout=600)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            killed_at = results()
            resumed = cli("resume", "--job-dir", str(job), "--no-progress", timeout=900)
            exported = cli("export", "--job-dir", str(job))
            assert exported.returncode == 0, exported.stderr
            finish_raw()
    finally:
        server.shutdown()
    return {
        "job": job,
        "lines": lines,
        "bad": bad,
        "killed_at": killed_at,
        "resume": resumed,
        "raw": json.loads(raw_out.read_text()),
    }


def transcription(cid: str, file_url: str, **body: Any) -> dict[str, Any]:
    """A /v1/audio/transcriptions line in vLLM's batch format."""
    return {
        "custom_id": cid,
        "method": "POST",
        "url": "/v1/audio/transcriptions",
        "body": {"model": AUDIO_MODEL, "file_url": file_url, **body},
    }


def audio_lines(media: Path) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """The audio job's lines, and the bad ones' expected error codes by custom_id."""
    lines = [json.loads(x) for x in TRANSCRIPTION_SAMPLE.read_text().splitlines() if x.strip()]
    (media / "local.wav").write_bytes(wav_bytes(0.7, 330))
    lines.append(transcription("file", (media / "local.wav").as_uri(), language="en"))
    # Longer than the tiny model's 5 s window: cut into clips, their texts joined.
    lines.append(transcription("long", data_url(wav_bytes(7.0, 520), "audio/wav"), language="en"))
    lines.append(
        transcription(
            "short-cap",
            data_url(wav_bytes(0.3, 990), "audio/wav"),
            language="en",
            max_completion_tokens=5,
        )
    )
    # verbose_json: segments cut from the model's timestamps, a short clip and a cut one.
    for cid, seconds, freq in (("verbose", 0.7, 610), ("verbose-long", 7.0, 740)):
        lines.append(
            transcription(
                cid,
                data_url(wav_bytes(seconds, freq), "audio/wav"),
                language="en",
                response_format="verbose_json",
                max_completion_tokens=12,
            )
        )
    # No language: the model finds it first (a request of one token), as vLLM's server does;
    # verbose_json says which it found.
    lines.append(transcription("detect", data_url(wav_bytes(0.3, 700), "audio/wav")))
    lines.append(
        transcription(
            "detect-verbose",
            data_url(wav_bytes(0.5, 450), "audio/wav"),
            response_format="verbose_json",
            max_completion_tokens=8,
        )
    )
    bad = {
        "not-audio": (
            "invalid_media",
            transcription("x", data_url(b"not a wav file", "audio/wav"), language="en"),
        ),
        "corrupt": ("invalid_media", transcription("x", "data:audio/wav;base64,UklG@@@")),
        "multipart": (
            "invalid_request",
            {**transcription("x", "data:audio/wav;base64,AAAA"), "body": {"file": "a.wav"}},
        ),
        "srt": (
            "invalid_request",
            transcription("x", "data:audio/wav;base64,AAAA", response_format="srt"),
        ),
    }
    for cid, (_, line) in bad.items():
        lines.append({**line, "custom_id": cid})
    return lines, {cid: code for cid, (code, _) in bad.items()}


def run_audio_job(tmp: Path, models: dict[str, Path]) -> dict[str, Any]:
    """The audio job on the tiny Whisper (1 engine start), and vLLM's own batch runner on the
    lines that have an answer (1 start; file:// lines given to it as data URLs)."""
    media = tmp / "media"
    media.mkdir()
    lines, bad = audio_lines(media)
    src = write_jsonl(tmp / "audio.jsonl", lines)
    job = tmp / "job"
    good = []
    for line in lines:
        if line["custom_id"] in bad:
            continue
        url = line["body"]["file_url"]
        if url.startswith("file:"):
            url = data_url(Path(url[len("file://") :]).read_bytes(), "audio/wav")
        good.append({**line, "body": {**line["body"], "file_url": url}})
    raw_in = write_jsonl(tmp / "raw.jsonl", good)
    raw_out = tmp / "raw-out.jsonl"
    # vLLM's batch runner runs beside batchrun's job (see run_image_job).
    raw = reference_run(
        [sys.executable, "-m", "vllm.entrypoints.openai.run_batch", "-i", str(raw_in),
         "-o", str(raw_out), "--model", str(models["audio"]), "--served-model-name", AUDIO_MODEL,
         "--dtype", "float32", "--max-model-len", "448", "--gpu-memory-utilization", "0.1",
         "--enforce-eager", "--seed", "0"],
        tmp / "raw.log",
    )  # fmt: skip
    with raw as finish_raw:
        run = cli(
            "submit", str(src), "--job-dir", str(job), "--model", str(models["audio"]),
            "--served-model-name", AUDIO_MODEL, "--dtype", "float32", "--no-progress",
            "--allowed-local-media-path", str(media), "--gpu-memory-utilization", "0.1",
            timeout=900,
        )  # fmt: skip
        exported = cli("export", "--job-dir", str(job))
        assert exported.returncode == 0, exported.stderr
        parquet = cli("export", "--job-dir", str(job), "--parquet")
        assert parquet.returncode == 0, parquet.stderr
        finish_raw()
    answers = {}
    for x in raw_out.read_text().splitlines():
        rec = json.loads(x)
        answers[rec["custom_id"]] = rec["response"]["body"]
    return {"job": job, "lines": lines, "bad": bad, "submit": run, "raw": answers}
