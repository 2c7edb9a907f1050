"""Image chat lines end to end through vLLM on a tiny Idefics3 (tests/support/mm_jobs.py): answers equal
raw vLLM's `LLM.chat` token for token at temperature 0, bad media are error records naming their
cause while the other lines run, and a job SIGKILLed mid-way resumes answering each line once."""

from __future__ import annotations

from typing import Any

import pytest
from support.lines import read_jsonl

pytestmark = pytest.mark.vllm


def _answers(job: Any) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for line in read_jsonl(job / "output.jsonl"):
        body = line["response"]["body"]
        found.setdefault(line["custom_id"], []).append(body["choices"][0]["message"]["content"])
    return found


def test_image_answers_equal_raw_vllm_chat(vllm_image_job: dict[str, Any]) -> None:
    """Every image line (data URLs, two images in one message, an image before the text, a
    file:// path under the allowed root, an http URL) answered as raw LLM.chat answers it."""
    answers = _answers(vllm_image_job["job"])
    raw = vllm_image_job["raw"]
    assert set(answers) == set(raw)
    assert {cid: texts[0] for cid, texts in answers.items()} == raw
    # The images matter: the answers are not all one text.
    assert len(set(raw.values())) > len(raw) // 2


def test_bad_media_are_error_records_naming_the_cause(vllm_image_job: dict[str, Any]) -> None:
    """Found at validation or by the worker, each bad medium fails its own line only."""
    job = vllm_image_job["job"]
    errors = {e["custom_id"]: e["error"] for e in read_jsonl(job / "errors.jsonl")}
    assert {cid: e["code"] for cid, e in errors.items()} == vllm_image_job["bad"]
    messages = {cid: e["message"] for cid, e in errors.items()}
    assert messages["not-an-image"] == (
        "cannot use the request's media: Failed to load image: cannot identify image file"
    )
    assert messages["http-404"].startswith(
        "cannot use the request's media: Failed to fetch media from URL: HTTP 404 error"
    )
    assert "is not valid base64" in messages["corrupt-base64"]
    assert "is not under --allowed-local-media-path" in messages["outside-root"]
    # Known from the model's config, so found at validation (the worker's check is the backstop).
    assert messages["audio-to-image-model"] == (
        "body.messages[0].content[1]: a part of type 'input_audio' needs a model that reads "
        "audio; idefics3 reads text, image"
    )


def test_a_job_killed_mid_way_resumes_answering_each_line_once(
    vllm_image_job: dict[str, Any],
) -> None:
    """SIGKILLed with some answers in its journal and some not, the job resumes: every line is
    answered exactly once, the answers raw vLLM's."""
    lines = vllm_image_job["lines"]
    answered = _answers(vllm_image_job["job"])
    assert 3 <= vllm_image_job["killed_at"] < len(lines) - len(vllm_image_job["bad"])
    assert vllm_image_job["resume"].returncode == 1, vllm_image_job["resume"].stderr  # bad media
    assert all(len(texts) == 1 for texts in answered.values())
    assert len(answered) + len(vllm_image_job["bad"]) == len(lines)
