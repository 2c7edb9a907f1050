"""The Responses API's `input_image` parts on /v1/responses: checked at validation as a chat
line's image_url part is (a file_id refused), rendered in the worker as the chat line's image
(the same chat messages reach vLLM's renderer), answered on the echo engine."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.cli import cli
from support.jobs import submit_echo
from support.lines import read_jsonl, read_lines, write_jsonl
from support.media import default_media_policy
from testmodels.multimodal import png_bytes

from batchrun.engines.vllm.media import media_messages
from batchrun.openai.media import MediaPolicy, use_media_policy
from batchrun.openai.records import LineError, Request
from batchrun.run.dedup import dedup_key

RED = "data:image/png;base64," + base64.b64encode(png_bytes(8, 8, (200, 30, 30))).decode()
BLUE = "data:image/png;base64," + base64.b64encode(png_bytes(8, 8, (30, 30, 200))).decode()
WHERE = "body.input[0].content[1]"


def responses_line(cid: str, image: dict[str, Any], role: str = "user") -> dict[str, Any]:
    """A /v1/responses line: one user message with a text part and `image`."""
    content = [{"type": "input_text", "text": "Describe the image."}, image]
    return {
        "custom_id": cid,
        "method": "POST",
        "url": "/v1/responses",
        "body": {
            "model": "m",
            "instructions": "Be brief.",
            "input": [{"role": role, "content": content}],
            "max_output_tokens": 8,
        },
    }


def image(url: object = RED, **more: Any) -> dict[str, Any]:
    """An input_image part (OpenAI's shape; `url` may be anything, to test the checks)."""
    part: dict[str, Any] = {"type": "input_image", **more}
    if url is not None:
        part["image_url"] = url
    return part


@pytest.fixture(autouse=True)
def default_policy() -> Iterator[None]:
    """Each test starts and ends with the default policy (this process's reader uses it)."""
    yield from default_media_policy()


def test_an_input_image_line_is_valid(tmp_path: Path) -> None:
    lines = [responses_line("a", image()), responses_line("b", image(detail="low"))]
    assert read_lines(tmp_path, *lines) == [
        Request("a", 1, "/v1/responses", lines[0]["body"]),
        Request("b", 2, "/v1/responses", lines[1]["body"]),
    ]


@pytest.mark.parametrize(
    ("part", "role", "code", "message"),
    [
        (
            image(None, file_id="file-abc123"),
            "user",
            "invalid_request",
            f"{WHERE}.file_id is not supported: batchrun has no file store; give the image as "
            "image_url (a data:image/...;base64, URL, an http(s) URL or a file:// URL)",
        ),
        (
            image(None),
            "user",
            "invalid_request",
            f"{WHERE}.image_url must be a string URL of the image; it is missing",
        ),
        (
            image({"url": RED}),
            "user",
            "invalid_request",
            f"{WHERE}.image_url must be a string URL of the image; got an object",
        ),
        (
            image(detail="tiny"),
            "user",
            "invalid_request",
            f"{WHERE}.detail must be one of low, high, auto, original, got 'tiny'",
        ),
        (
            image("data:image/png;base64,iVBOR$w0K"),
            "user",
            "invalid_media",
            f"{WHERE}.image_url is not valid base64: '$' at character 27 is not a base64 digit",
        ),
        (
            image("data:audio/wav;base64,UklGRg=="),
            "user",
            "invalid_media",
            f"{WHERE}.image_url is a data URL of type 'audio/wav', not an image",
        ),
        (
            image(),
            "system",
            "invalid_request",
            f"{WHERE}.type 'input_image' is only taken in a user message",
        ),
    ],
)
def test_a_bad_input_image_is_an_error_record_naming_the_field(
    tmp_path: Path, part: dict[str, Any], role: str, code: str, message: str
) -> None:
    [err] = read_lines(tmp_path, responses_line("a", part, role))
    assert err == LineError(1, "a", code, message)


def test_input_images_count_against_the_limit_and_the_models_modalities(tmp_path: Path) -> None:
    use_media_policy(
        MediaPolicy(limit_mm_per_prompt=(("image", 1),), model_modalities=("text",), model_name="t")
    )
    [err] = read_lines(tmp_path, responses_line("a", image()))
    assert err == LineError(
        1,
        "a",
        "invalid_media",
        f"{WHERE}: a part of type 'input_image' needs a model that reads image; t reads text",
    )
    use_media_policy(MediaPolicy(limit_mm_per_prompt=(("image", 1),)))
    line = responses_line("b", image())
    line["body"]["input"][0]["content"].append(image(BLUE))
    [err] = read_lines(tmp_path, line)
    assert err == LineError(
        1,
        "b",
        "invalid_media",
        "body.input[0].content[2]: the request holds more than 1 image part, the limit "
        "--limit-mm-per-prompt sets",
    )


def test_the_worker_renders_an_input_image_as_the_chat_lines_image_url() -> None:
    """What reaches vLLM's chat renderer for a responses line is what a chat line with the same
    instructions, text and image_url part hands it."""
    line = responses_line("a", image(detail="high"))
    request = Request("a", 1, line["url"], line["body"])
    assert media_messages(request) == [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Describe the image."},
                {"type": "image_url", "image_url": {"url": RED, "detail": "high"}},
            ],
        },
    ]
    # A responses line without images keeps its text path (no media rendering).
    text = Request(
        "t", 1, line["url"], {"model": "m", "input": [{"role": "user", "content": "hi"}]}
    )
    assert media_messages(text) is None


def test_two_lines_with_different_images_are_not_duplicates() -> None:
    a = responses_line("a", image(RED))
    b = responses_line("b", image(BLUE))
    c = responses_line("c", image(RED))
    for line in (a, b, c):
        line["body"]["temperature"] = 0
    key = {
        x["custom_id"]: dedup_key(Request(x["custom_id"], 1, x["url"], x["body"]))
        for x in (a, b, c)
    }
    assert key["a"] is not None and key["a"] == key["c"] and key["a"] != key["b"]


def test_the_echo_engine_answers_input_image_lines_and_refuses_bad_ones(tmp_path: Path) -> None:
    lines = [
        responses_line("red", image(RED)),
        responses_line("blue", image(BLUE, detail="auto")),
        responses_line("stored", image(None, file_id="file-abc123")),
    ]
    src = write_jsonl(tmp_path / "in.jsonl", lines)
    job = tmp_path / "job"
    run = submit_echo(src, job)
    assert run.returncode == 1, run.stderr
    assert cli("export", "--job-dir", str(job)).returncode == 0
    answers = {
        r["custom_id"]: r["response"]["body"]["output"][0]["content"][0]["text"]
        for r in read_jsonl(job / "output.jsonl")
    }
    assert answers == {"red": "Describe the image.", "blue": "Describe the image."}
    [error] = read_jsonl(job / "errors.jsonl")
    assert (error["custom_id"], error["error"]["code"], error["error"]["line"]) == (
        "stored",
        "invalid_request",
        3,
    )
