"""Media parts in chat lines: the cheap checks made at validation (every bad kind an error record
naming its cause, the others run), the media options, and the keys that tell media apart."""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.cli import cli
from support.jobs import submit_echo
from support.lines import media_line, read_jsonl, request_line, write_jsonl
from support.media import default_media_policy
from testmodels.multimodal import png_bytes, wav_bytes

from batchrun.openai.reader import read_input
from batchrun.openai.records import LineError, Request
from batchrun.run.dedup import dedup_key
from batchrun.run.planner import prompt_text

WIDE = {"COLUMNS": "1000"}  # usage errors on one line
PNG = png_bytes(8, 8, (200, 30, 30))
PNG_URL = "data:image/png;base64," + base64.b64encode(PNG).decode()
WHERE = "body.messages[0].content[1]"


def image_line(cid: str, url: str, text: str = "Describe the image.") -> dict[str, Any]:
    """A chat line with one text and one image_url part."""
    part = {"type": "image_url", "image_url": {"url": url}}
    return media_line(cid, part, text, temperature=0, max_tokens=4)


def part_line(cid: str, part: dict[str, Any]) -> dict[str, Any]:
    """A chat line with one text part and `part`."""
    line = image_line(cid, PNG_URL)
    line["body"]["messages"][0]["content"][1] = part
    return line


@pytest.fixture(autouse=True)
def default_policy() -> Iterator[None]:
    """Each test starts from the default policy (this process's reader uses it)."""
    yield from default_media_policy()


def test_every_bad_media_kind_is_an_error_record_and_the_good_lines_run(tmp_path: Path) -> None:
    """A job with good media and one line of each bad kind: the bad ones are error records at
    validation (before any engine runs), with the cause named; the good ones are answered."""
    root = tmp_path / "media"
    root.mkdir()
    (root / "red.png").write_bytes(PNG)
    (root / "big.png").write_bytes(PNG + b"\0" * 5000)
    outside = tmp_path / "outside.png"
    outside.write_bytes(PNG)
    audio = base64.b64encode(wav_bytes(0.1, 440)).decode()
    lines = [
        image_line("data", PNG_URL),
        image_line("file", (root / "red.png").as_uri()),
        image_line("http", "http://images.example.com/cat.png"),
        part_line(
            "audio", {"type": "input_audio", "input_audio": {"data": audio, "format": "wav"}}
        ),
        image_line("corrupt", "data:image/png;base64,iVBOR$w0K"),
        image_line("padding", "data:image/png;base64,iVBORw0"),
        image_line("not-image", "data:text/plain;base64,aGVsbG8="),
        image_line("not-base64", "data:image/png,rawbytes"),
        image_line("outside", outside.as_uri()),
        image_line("missing", (root / "gone.png").as_uri()),
        image_line("too-big", (root / "big.png").as_uri()),
        image_line("big-data", "data:image/png;base64," + "A" * 8000),
        image_line("host", "https://evil.example.org/x.png"),
        image_line("scheme", "ftp://images.example.com/x.png"),
        part_line("two", {"type": "image_url", "image_url": {"url": PNG_URL}})
        | {
            "body": {
                "model": "m",
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "image_url", "image_url": {"url": PNG_URL}},
                            {"type": "image_url", "image_url": {"url": PNG_URL}},
                            {"type": "image_url", "image_url": {"url": PNG_URL}},
                        ],
                    }
                ],
            }
        },
        part_line("audio-format", {"type": "input_audio", "input_audio": {"data": audio}}),
    ]
    src = write_jsonl(tmp_path / "in.jsonl", lines)
    job = tmp_path / "job"
    run = submit_echo(
        src,
        job,
        "--allowed-local-media-path",
        str(root),
        "--allowed-media-domains",
        "images.example.com",
        "--max-media-bytes",
        "5000",
        "--limit-mm-per-prompt",
        "image=2",
    )
    assert run.returncode == 1, run.stderr
    assert cli("export", "--job-dir", str(job)).returncode == 0
    answered = {r["custom_id"] for r in read_jsonl(job / "output.jsonl")}
    assert answered == {"data", "file", "http", "audio"}
    errors = {
        r["custom_id"]: (r["error"]["code"], r["error"]["message"])
        for r in read_jsonl(job / "errors.jsonl")
    }
    url = f"{WHERE}.image_url.url"
    m = "invalid_media"
    assert errors == {
        "corrupt": (m, f"{url} is not valid base64: '$' at character 27 is not a base64 digit"),
        "padding": (m, f"{url} is not valid base64: its length or padding is wrong"),
        "not-image": (m, f"{url} is a data URL of type 'text/plain', not an image"),
        "not-base64": (m, f"{url} is a data URL that is not base64 (data:<type>;base64,...)"),
        "outside": (m, f"{url}: {outside} is not under --allowed-local-media-path {root}"),
        "missing": (m, f"{url}: cannot read {root / 'gone.png'}: No such file or directory"),
        "too-big": (
            m,
            f"{url}: {root / 'big.png'} is {len(PNG) + 5000:,} bytes, over --max-media-bytes 5,000",
        ),
        "big-data": (m, f"{url} holds about 6,000 bytes of media, over --max-media-bytes 5,000"),
        "host": (
            m,
            f"{url}: the host 'evil.example.org' is not in --allowed-media-domains "
            "(images.example.com)",
        ),
        "scheme": (
            m,
            f"{url} must be a data: URL (base64), an http(s):// URL or a file:// URL, "
            "got 'ftp://images.example.com/x.png'",
        ),
        "two": (
            m,
            "body.messages[0].content[2]: the request holds more than 2 image parts, the "
            "limit --limit-mm-per-prompt sets",
        ),
        "audio-format": (
            "invalid_request",
            f"{WHERE}.input_audio.format must be one of wav, mp3, flac, ogg, m4a, webm, got null",
        ),
    }


def test_file_urls_are_refused_without_an_allowed_root(tmp_path: Path) -> None:
    """By default no file is read: the message names the option that allows it."""
    (tmp_path / "red.png").write_bytes(PNG)
    src = write_jsonl(tmp_path / "in.jsonl", [image_line("a", (tmp_path / "red.png").as_uri())])
    [err] = list(read_input(src))
    assert err == LineError(
        1,
        "a",
        "invalid_media",
        f"{WHERE}.image_url.url: file:// URLs are refused unless --allowed-local-media-path "
        "names a directory they may read from",
    )


def test_an_allowed_root_that_does_not_exist_is_refused_before_a_job_exists(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", [image_line("a", PNG_URL)])
    job = tmp_path / "job"
    run = submit_echo(
        src, job, "--allowed-local-media-path", str(tmp_path / "nowhere"), env=WIDE, progress=True
    )
    assert run.returncode == 2
    assert (
        f"Invalid value for '--allowed-local-media-path': {tmp_path / 'nowhere'} does not exist"
    ) in run.stderr, run.stderr
    assert not job.exists()


def test_a_bad_limit_is_a_usage_error(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", [image_line("a", PNG_URL)])
    run = submit_echo(
        src, tmp_path / "job", "--limit-mm-per-prompt", "images=2", env=WIDE, progress=True
    )
    assert run.returncode == 2
    assert (
        "Invalid value for '--limit-mm-per-prompt': names image, audio or video, got 'images'"
    ) in run.stderr, run.stderr


def _request(line: dict[str, Any]) -> Request:
    return Request(line["custom_id"], 1, line["url"], line["body"])


def test_dedup_keys_tell_images_apart_and_file_media_by_content(tmp_path: Path) -> None:
    """Same text, different image: not duplicates. Same body: duplicates. A file named by the
    same path is another medium once it changed (size or modification time)."""
    other = "data:image/png;base64," + base64.b64encode(png_bytes(8, 8, (0, 0, 200))).decode()
    a, b, c = image_line("a", PNG_URL), image_line("b", other), image_line("c", PNG_URL)
    assert dedup_key(_request(a)) != dedup_key(_request(b))
    assert dedup_key(_request(a)) == dedup_key(_request(c))
    path = tmp_path / "x.png"
    path.write_bytes(PNG)
    first = dedup_key(_request(image_line("f", path.as_uri())))
    assert first == dedup_key(_request(image_line("g", path.as_uri())))
    path.write_bytes(PNG + b"\0")
    os.utime(path, ns=(1, 1))
    assert dedup_key(_request(image_line("f", path.as_uri()))) != first


def test_the_plan_reads_images_as_part_of_the_prompt() -> None:
    """Two lines with the same text and different images do not share their whole prompt."""
    other = "data:image/png;base64," + base64.b64encode(png_bytes(8, 8, (0, 0, 200))).decode()
    a = prompt_text(_request(image_line("a", PNG_URL)))
    b = prompt_text(_request(image_line("b", other)))
    assert a != b
    assert a.startswith("user\x1eDescribe the image.\n\x1f")
    assert json.dumps(a).count("base64") == 0  # a digest, not the image's text


def _audio_line(cid: str, url: str = "/v1/audio/transcriptions", **body: Any) -> dict[str, Any]:
    return request_line(cid, url, {"model": "w", **body})


WAV_URL = "data:audio/wav;base64," + base64.b64encode(wav_bytes(0.1, 440)).decode()


@pytest.mark.parametrize(
    ("body", "code", "message"),
    [
        ({"file_url": WAV_URL, "language": "en", "response_format": "text"}, None, None),
        ({"file_url": WAV_URL, "prompt": "A tone.", "temperature": 0.2}, None, None),
        (
            {"file": "a.wav"},
            "invalid_request",
            "body.file is not supported in batch requests (there is no multipart upload); pass "
            "the audio as body.file_url: a data:audio/...;base64, URL, an http(s) URL or a file:// "
            "URL",
        ),
        (
            {},
            "invalid_request",
            "body.file_url is missing; a transcription needs the audio as a data:audio/...;base64, "
            "URL, an http(s) URL or a file:// URL",
        ),
        (
            {"file_url": PNG_URL},
            "invalid_media",
            "body.file_url is a data URL of type 'image/png', not audio",
        ),
        ({"file_url": WAV_URL, "response_format": "verbose_json"}, None, None),
        (
            {"file_url": WAV_URL, "response_format": "srt"},
            "invalid_request",
            "body.response_format 'srt' is not supported: vLLM answers json, text, verbose_json",
        ),
        (
            {"file_url": WAV_URL, "response_format": "vtt"},
            "invalid_request",
            "body.response_format 'vtt' is not supported: vLLM answers json, text, verbose_json",
        ),
        (
            {"file_url": WAV_URL, "response_format": "xml"},
            "invalid_request",
            "body.response_format must be one of json, text, verbose_json, got 'xml'",
        ),
        (
            {"file_url": WAV_URL, "temperature": 2},
            "invalid_request",
            None,
        ),
    ],
)
def test_transcription_lines_are_checked_at_validation(
    tmp_path: Path, body: dict[str, Any], code: str | None, message: str | None
) -> None:
    """Transcription and translation lines in vLLM's batch format: the audio as file_url."""
    lines = [_audio_line("t", **body), _audio_line("x", "/v1/audio/translations", **body)]
    for line in lines:
        src = write_jsonl(tmp_path / "in.jsonl", [line])
        [item] = list(read_input(src))
        if code is None:
            assert item == Request(line["custom_id"], 1, line["url"], line["body"])
            continue
        assert isinstance(item, LineError)
        assert item.code == code
        if message is not None:
            assert item.message == message


def test_a_transcription_of_a_changed_file_is_not_a_duplicate(tmp_path: Path) -> None:
    """A transcription's file:// audio is keyed by what the file is, as a chat line's image."""
    path = tmp_path / "a.wav"
    path.write_bytes(wav_bytes(0.1, 440))
    line = _audio_line("a", file_url=path.as_uri(), temperature=0)
    first = dedup_key(_request(line))
    assert first is not None and first == dedup_key(_request({**line, "custom_id": "b"}))
    path.write_bytes(wav_bytes(0.2, 440))
    assert dedup_key(_request(line)) != first


def test_the_echo_engine_answers_audio_lines_in_the_transcription_shape() -> None:
    """A dry run of a transcription file shows OpenAI's transcription body (the line's prompt as
    its text, no audio decoded), not a text completion."""
    from batchrun.config import EngineSettings
    from batchrun.engines.echo import EchoEngine
    from batchrun.openai.records import TRANSCRIPTIONS, TRANSLATIONS, Request

    engine = EchoEngine(EngineSettings(engine="echo"))
    body = {"file_url": "data:audio/wav;base64,UklGRg==", "prompt": "a tone"}
    engine.add(Request("t", 1, TRANSCRIPTIONS, body))
    engine.add(Request("u", 2, TRANSLATIONS, body))
    out = {o.custom_id: o.body for o in engine.step()}
    assert out == {
        "t": {"text": "a tone", "usage": {"type": "duration", "seconds": 0}},
        "u": {"text": "a tone"},
    }
