"""Chat requests with media parts, rendered by vLLM's own chat path in the worker.

A chat line with image_url, input_audio, audio_url or video_url parts is handed to vLLM's renderer
as the OpenAI-shaped messages it is (`renderer.render_chat`, what `LLM.chat` calls): vLLM fetches
(data:, file:// under --allowed-local-media-path, http(s) within --allowed-media-domains and its
fetch timeout), decodes, and expands the media into the model's placeholder tokens exactly as
raw `LLM.chat` does, so the answers are raw vLLM's. This happens when the line is dispatched, in
the worker: the parent only ever holds the lines of its window.

A medium that cannot be read (corrupt base64, not an image, a file outside the root, a URL that
times out or answers 404) fails its request with code `invalid_media` (400), never the worker.
"""

from __future__ import annotations

import base64
import contextlib
import io
import math
import os
import re
from typing import Any

from batchrun.config import EngineSettings
from batchrun.engines.vllm.errors import BadRequest
from batchrun.openai.media import MEDIA_PARTS
from batchrun.openai.records import CHAT, RESPONSES, Request
from batchrun.openai.responses_api import responses_messages

# The warm-up request's id in vLLM (never a line's: it runs before any line reaches the engine).
_WARM_UP_ID = "batchrun-warm-up"
_OBJECT_REPR = re.compile(r":? ?<[\w.]+ object at 0x[0-9a-f]+>")


def media_engine_args(settings: EngineSettings) -> dict[str, Any]:
    """vLLM's engine arguments for a job's media options (only those set)."""
    args: dict[str, Any] = {}
    if settings.allowed_local_media_path is not None:
        args["allowed_local_media_path"] = settings.allowed_local_media_path
    if settings.allowed_media_domains:
        args["allowed_media_domains"] = list(settings.allowed_media_domains)
    if settings.limit_mm_per_prompt:
        args["limit_mm_per_prompt"] = dict(settings.limit_mm_per_prompt)
    return args


def set_fetch_timeouts(settings: EngineSettings) -> None:
    """--media-fetch-timeout as vLLM's per-modality fetch timeouts (whole seconds; vLLM reads
    them from its environment at each fetch). Unset: vLLM's 5 s image, 10 s audio, 30 s video."""
    if settings.media_fetch_timeout is None:
        return
    seconds = str(max(1, math.ceil(settings.media_fetch_timeout)))
    for kind in ("IMAGE", "AUDIO", "VIDEO"):
        os.environ[f"VLLM_{kind}_FETCH_TIMEOUT"] = seconds


def media_messages(request: Request) -> list[Any] | None:
    """A chat or responses request's messages when they hold a media part (a responses
    input_image is an image_url part of the chat it amounts to); None when they hold none."""
    if request.url == CHAT:
        messages = request.body.get("messages")
    elif request.url == RESPONSES and isinstance(request.body.get("input"), list):
        messages = responses_messages(request.body)
    else:
        return None
    return messages if has_media(messages) else None


def has_media(messages: Any) -> bool:
    """Whether chat messages hold a media part."""
    for message in messages if isinstance(messages, list) else ():
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and part.get("type") in MEDIA_PARTS:
                    return True
    return False


def modalities(engine: Any) -> tuple[str, ...]:
    """The media the loaded model takes, as vLLM's processor says (empty: text only)."""
    model_config = engine.model_config
    if getattr(model_config, "multimodal_config", None) is None:
        return ()
    processor = getattr(getattr(engine, "renderer", None), "mm_processor", None)
    info = getattr(processor, "info", None)
    try:
        limits = info.supported_mm_limits if info is not None else {}
    except Exception:  # older versions: only the method
        limits = info.get_supported_mm_limits() if info is not None else {}
    return tuple(sorted(limits))


def check_modalities(messages: list[Any], taken: tuple[str, ...], model_name: str) -> None:
    """Refuse a media part the model cannot take, naming what it takes."""
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        for part in content if isinstance(content, list) else ():
            kind = part.get("type") if isinstance(part, dict) else None
            if kind not in MEDIA_PARTS:
                continue
            modality = MEDIA_PARTS[str(kind)][0]
            if modality not in taken:
                reads = ", ".join(("text", *taken))
                raise BadRequest(
                    f"a part of type {kind!r} needs a model that reads {modality}; "
                    f"{model_name} reads {reads}",
                    code="invalid_media",
                )


def render_media_chat(
    engine: Any, request: Request, messages: list[Any], template_kwargs: dict[str, Any]
) -> Any:
    """A request's chat `messages` rendered, media read and processed, by vLLM's chat path:
    the engine input `LLM.chat` would add for them."""
    from vllm.renderers import ChatParams

    body = request.body
    renderer = engine.renderer
    tools = body.get("tools") or None
    chat_params = ChatParams(
        chat_template=None,
        chat_template_content_format="auto",
        chat_template_kwargs={
            **template_kwargs,
            "add_generation_prompt": True,
            "continue_final_message": False,
            "tools": tools,
            "tokenize": False,
        },
    )
    # As LLM.chat: the template writes the special tokens, the tokenizer adds none.
    tok_params = renderer.default_chat_tok_params.with_kwargs(add_special_tokens=False)
    try:
        _, prompts = renderer.render_chat([messages], chat_params, tok_params)
    except Exception as exc:  # vLLM's own reading of the media: its message names the cause
        raise BadRequest(
            f"cannot use the request's media: {_reason(exc)}", "invalid_media"
        ) from exc
    return prompts[0]


def warm_media_path(engine: Any, taken: tuple[str, ...]) -> None:
    """Run what a model's first media line would wait for at the engine's start: vLLM's chat path
    loads the model's processor at its first call (for its chat template, and for its images),
    and the vision encoder's first pass is slow (2-2.5 s on the tests' tiny Idefics3, its core in
    this process, docs/multimodal.md). A model that reads images renders a small image chat and
    generates one token for it; another, a text chat. A failure is left to the lines to report."""
    from vllm import SamplingParams

    content: list[dict[str, Any]] = [{"type": "text", "text": "Hello"}]
    if "image" in taken:
        content.append({"type": "image_url", "image_url": {"url": _small_png_url()}})
    messages = [{"role": "user", "content": content}]
    request = Request(_WARM_UP_ID, 0, CHAT, {"messages": messages})
    try:
        prompt = render_media_chat(engine, request, messages, {})
        if "image" not in taken:
            return
        engine.add_request(_WARM_UP_ID, prompt, SamplingParams(temperature=0, max_tokens=1))
        while engine.has_unfinished_requests():
            engine.step()
    except Exception:
        with contextlib.suppress(Exception):
            engine.abort_request([_WARM_UP_ID])


def _small_png_url() -> str:
    """A 32x32 grey PNG as a data URL (PIL, which vLLM's image loading needs anyway)."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (32, 32), (128, 128, 128)).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def prompt_length(prompt: Any) -> int:
    """The number of tokens of a prompt vLLM rendered (media placeholders included)."""
    ids = prompt.get("prompt_token_ids") if isinstance(prompt, dict) else None
    if ids is None:
        ids = getattr(prompt, "prompt_token_ids", None) or []
    return len(ids)


def _reason(exc: BaseException) -> str:
    """An exception's message, the first line only; its cause's too when it says more."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    text = _OBJECT_REPR.sub("", text)  # "<_io.BytesIO object at 0x...>" says nothing to a user
    cause = exc.__cause__ or exc.__context__
    said = _OBJECT_REPR.sub("", str(cause).strip().splitlines()[0]) if cause is not None else ""
    if said and said not in text:
        text = f"{text} ({said})"
    return text[:500]
