"""The rules of /v1/audio/transcriptions and /v1/audio/translations bodies, in vLLM's batch format:
the audio as `file_url` (a `data:audio/...;base64,` URL, an http(s) URL, or a file:// path under
--allowed-local-media-path), never a multipart `file`; `language`, `prompt`, `temperature`,
`response_format`, `max_completion_tokens` and vLLM's sampling fields."""

from __future__ import annotations

from typing import Any

from batchrun.openai.fields import (
    MAX_TOKENS_LIMIT,
    FieldCheck,
    check_seed,
    check_string,
    int_in,
    number_in,
)
from batchrun.openai.invalid import InvalidLine, bad, describe, show
from batchrun.openai.media import check_media_url, media_policy

# What vLLM 0.32's server answers for a speech-to-text model (verbose_json: a model that writes
# timestamps, such as Whisper; the worker refuses it for another). vLLM refuses srt and vtt;
# diarized_json needs a diarizing model, which batchrun does not run yet.
RESPONSE_FORMATS = ("json", "text", "verbose_json")
# The forms body.file_url takes (check_media_url reads each; a file:// URL under
# --allowed-local-media-path), named the same way in every message that asks for one.
FILE_URL_FORMS = "a data:audio/...;base64, URL, an http(s) URL or a file:// URL"


def check_audio_body(body: dict[str, Any]) -> None:
    """A transcription or translation body: its audio as file_url, checked without reading it."""
    if "file" in body:
        bad(
            "body.file is not supported in batch requests (there is no multipart upload); "
            f"pass the audio as body.file_url: {FILE_URL_FORMS}"
        )
    if "file_url" not in body:
        bad(f"body.file_url is missing; a transcription needs the audio as {FILE_URL_FORMS}")
    url = body["file_url"]
    if not isinstance(url, str):
        bad(f"body.file_url must be a string URL, got {describe(url)}")
    policy = media_policy()
    check_media_url("body.file_url", url, "audio", policy)
    if policy.model_modalities is not None and "audio" not in policy.model_modalities:
        # Known from the model's config (models/modalities.py); the worker says it otherwise.
        bad(
            "this line needs a speech-to-text model (such as Whisper); "
            f"{policy.model_name} reads {', '.join(policy.model_modalities)}"
        )
    if body.get("stream"):
        bad("body.stream is not supported: a batch answers each line whole")


def _response_format(key: str, value: object) -> None:
    if value in RESPONSE_FORMATS:
        return
    supported = ", ".join(RESPONSE_FORMATS)
    if value in ("srt", "vtt", "diarized_json"):
        raise InvalidLine(
            "invalid_request",
            f"body.{key} {show(value)} is not supported: vLLM answers {supported}",
        )
    bad(f"body.{key} must be one of {supported}, got {show(value)}")


AUDIO_CHECKS: dict[str, FieldCheck] = {
    "language": check_string,
    "to_language": check_string,
    "prompt": check_string,
    "temperature": number_in(0, 1),
    "response_format": _response_format,
    "max_completion_tokens": int_in(1, MAX_TOKENS_LIMIT),
    "top_p": number_in(0, 1),
    "seed": check_seed,
}
