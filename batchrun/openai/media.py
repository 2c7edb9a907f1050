"""The cheap checks of a chat line's media parts (image_url, input_audio, audio_url, video_url),
made when the line is validated so that a job's bad media are error records at once.

Cheap means no decoding and no network: a data URL's base64 is checked well-formed and its size
counted, a `file://` path checked under `--allowed-local-media-path` and its size read from the
file system, an http(s) URL's host checked against `--allowed-media-domains`, the parts counted
against `--limit-mm-per-prompt`. Reading and decoding happen in the worker, when the line is
dispatched (vLLM's own media code, which also answers a URL that times out or an image that does
not decode): the parent never holds more media than its window of requests.

The limits are a job's options, and the reader's rules are pure functions of a line; the options
reach them as this process's `MediaPolicy`, set by `use_media_policy` before a job's input is read
(RunOptions.check, which every command that reads an input runs first).
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from batchrun.openai.invalid import InvalidLine, describe, show

# vLLM's fetch timeouts (VLLM_IMAGE_FETCH_TIMEOUT, _AUDIO_, _VIDEO_), in seconds.
DEFAULT_FETCH_TIMEOUTS = {"image": 5.0, "audio": 10.0, "video": 30.0}
DEFAULT_MAX_MEDIA_BYTES = 20 * 1024 * 1024
# A part's type -> (its modality, the key holding its URL or data).
MEDIA_PARTS: dict[str, tuple[str, str]] = {
    "image_url": ("image", "image_url"),
    "audio_url": ("audio", "audio_url"),
    "video_url": ("video", "video_url"),
    "input_audio": ("audio", "input_audio"),
}
# A Responses API input_image's detail (OpenAI's values; vLLM reads the image whatever it says).
IMAGE_DETAILS = ("low", "high", "auto", "original")
# input_audio's formats (OpenAI's wav and mp3, and what vLLM's decoders read besides).
AUDIO_FORMATS = ("wav", "mp3", "flac", "ogg", "m4a", "webm")
_A = {"image": "an image", "audio": "audio", "video": "a video"}
# A character that is no base64 digit, and a well-formed end (padding only at the end).
_NOT_BASE64 = re.compile(r"[^A-Za-z0-9+/=]")
_PADDING = re.compile(r"[^=]{4}|[^=]{3}=|[^=]{2}==")


@dataclass(frozen=True)
class MediaPolicy:
    """What a job lets its lines' media be: where files may come from, which hosts, how big."""

    allowed_local_media_path: str | None = None
    allowed_media_domains: tuple[str, ...] = ()
    max_media_bytes: int = DEFAULT_MAX_MEDIA_BYTES
    # modality -> the most parts of it one request may hold; a modality not named: no limit here
    # (vLLM's own default, the model's, still holds in the worker).
    limit_mm_per_prompt: tuple[tuple[str, int], ...] = ()
    # What the job's model reads ("text" first), known from its config before the engine starts
    # (models/modalities.py); None: not known here, the worker checks.
    model_modalities: tuple[str, ...] | None = None
    model_name: str = "the model"

    def limit(self, modality: str) -> int | None:
        """The most parts of `modality` a request may hold; None: no limit set."""
        return dict(self.limit_mm_per_prompt).get(modality)

    def check_reads(self, where: str, kind: str, modality: str) -> None:
        """Refuse a part of `kind` (its field path `where`) when the model is known not to read
        its modality; the message names what the model reads (the worker's, with the path)."""
        taken = self.model_modalities
        if taken is not None and modality not in taken:
            raise bad_media(
                f"{where}: a part of type {kind!r} needs a model that reads {modality}; "
                f"{self.model_name} reads {', '.join(taken)}"
            )


_policy = MediaPolicy()


def use_media_policy(policy: MediaPolicy) -> None:
    """Make `policy` the one this process's readers check media parts against."""
    global _policy
    _policy = policy


def media_policy() -> MediaPolicy:
    """The policy media parts are checked against in this process."""
    return _policy


def parse_limits(text: str) -> tuple[tuple[str, int], ...]:
    """`--limit-mm-per-prompt` as vLLM takes it: JSON `{"image": 2}` or `image=2,audio=1`."""
    import json

    text = text.strip()
    pairs: dict[str, Any]
    if text.startswith("{"):
        try:
            pairs = json.loads(text)
        except ValueError as e:
            raise ValueError(f"is not valid JSON: {e}") from None
        if not isinstance(pairs, dict):
            raise ValueError('must be a JSON object such as {"image": 2}')
    else:
        pairs = {}
        for item in filter(None, (p.strip() for p in text.split(","))):
            name, sep, value = item.partition("=")
            if not sep:
                raise ValueError(f"takes modality=count pairs such as image=2, got {item!r}")
            try:
                pairs[name.strip()] = int(value)
            except ValueError:
                raise ValueError(
                    f"needs a whole number for {name.strip()!r}, got {value!r}"
                ) from None
    out: list[tuple[str, int]] = []
    for name, count in pairs.items():
        if name not in ("image", "audio", "video"):
            raise ValueError(f"names image, audio or video, got {name!r}")
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(f"needs a count of 0 or more for {name}, got {count!r}")
        out.append((name, count))
    return tuple(sorted(out))


def bad_media(message: str) -> InvalidLine:
    """The error of a media part that cannot be used (code `invalid_media`)."""
    return InvalidLine("invalid_media", message)


def is_media_part(kind: object) -> bool:
    """Whether a content part's type is one of the media parts."""
    return kind in MEDIA_PARTS


def check_media_part(where: str, part: dict[str, Any], counts: dict[str, int]) -> None:
    """Check one media part (`where`: its field path) and count it into `counts` by modality."""
    kind = str(part.get("type"))
    modality, key = MEDIA_PARTS[kind]
    policy = _policy
    _count_part(where, kind, modality, counts, policy)
    value = part.get(key)
    if kind == "input_audio":
        if not isinstance(value, dict):
            raise InvalidLine(
                "invalid_request",
                f'{where}.input_audio must be an object {{"data", "format"}}, got {describe(value)}',
            )
        fmt = value.get("format")
        if fmt not in AUDIO_FORMATS:
            raise InvalidLine(
                "invalid_request",
                f"{where}.input_audio.format must be one of {', '.join(AUDIO_FORMATS)}, "
                f"got {show(fmt)}",
            )
        data = value.get("data")
        if not isinstance(data, str):
            raise InvalidLine(
                "invalid_request",
                f"{where}.input_audio.data must be a base64 string, got {describe(data)}",
            )
        _check_base64(f"{where}.input_audio.data", data, 0, policy)
        return
    # image_url / audio_url / video_url: {"url": ...} as OpenAI writes it, or the URL itself.
    url = value.get("url") if isinstance(value, dict) else value
    if not isinstance(url, str):
        raise InvalidLine(
            "invalid_request",
            f'{where}.{key} must be an object {{"url": ...}} with a string url, '
            f"got {describe(value)}",
        )
    check_media_url(f"{where}.{key}.url", url, modality, policy)


def check_input_image(where: str, part: dict[str, Any], counts: dict[str, int]) -> None:
    """Check a Responses API `input_image` part ({"image_url": URL, "detail"?}) as a chat
    image_url part is checked, and count it; a `file_id` (a file stored with OpenAI) is refused."""
    policy = _policy
    if part.get("file_id") is not None:
        raise InvalidLine(
            "invalid_request",
            f"{where}.file_id is not supported: batchrun has no file store; give the image as "
            "image_url (a data:image/...;base64, URL, an http(s) URL or a file:// URL)",
        )
    url = part.get("image_url")
    if not isinstance(url, str):
        got = "it is missing" if "image_url" not in part else f"got {describe(url)}"
        raise InvalidLine(
            "invalid_request", f"{where}.image_url must be a string URL of the image; {got}"
        )
    detail = part.get("detail")
    if detail is not None and detail not in IMAGE_DETAILS:
        raise InvalidLine(
            "invalid_request",
            f"{where}.detail must be one of {', '.join(IMAGE_DETAILS)}, got {show(detail)}",
        )
    _count_part(where, "input_image", "image", counts, policy)
    check_media_url(f"{where}.image_url", url, "image", policy)


def _count_part(
    where: str, kind: str, modality: str, counts: dict[str, int], policy: MediaPolicy
) -> None:
    """Refuse a part the model does not read, count it, and hold it to --limit-mm-per-prompt."""
    policy.check_reads(where, kind, modality)
    counts[modality] = counts.get(modality, 0) + 1
    limit = policy.limit(modality)
    if limit is not None and counts[modality] > limit:
        raise bad_media(
            f"{where}: the request holds more than {limit} {modality} part"
            f"{'' if limit == 1 else 's'}, the limit --limit-mm-per-prompt sets"
        )


def check_media_url(where: str, url: str, modality: str, policy: MediaPolicy) -> None:
    """Check a media URL without fetching it: data (base64, kind, size), file (root, size),
    http(s) (host)."""
    if url.startswith("data:"):
        head, comma, payload = url.partition(",")
        if not comma or not head.endswith(";base64"):
            raise bad_media(f"{where} is a data URL that is not base64 (data:<type>;base64,...)")
        mime = head[len("data:") : -len(";base64")].split(";")[0].strip().lower()
        if not mime.startswith(modality + "/"):
            raise bad_media(f"{where} is a data URL of type {mime or 'none'!r}, not {_A[modality]}")
        _check_base64(where, payload, len(head) + 1, policy)
        return
    parsed = urlparse(url)
    scheme = parsed.scheme.lower()
    if scheme == "file":
        check_local_file(where, parsed, policy)
        return
    if scheme in ("http", "https"):
        host = (parsed.hostname or "").lower()
        if not host:
            raise bad_media(f"{where} {show(url)} names no host")
        domains = policy.allowed_media_domains
        if domains and host not in domains:
            raise bad_media(
                f"{where}: the host {host!r} is not in --allowed-media-domains "
                f"({', '.join(domains)})"
            )
        return
    raise bad_media(
        f"{where} must be a data: URL (base64), an http(s):// URL or a file:// URL, got {show(url)}"
    )


def _check_base64(where: str, payload: str, offset: int, policy: MediaPolicy) -> None:
    """A base64 payload: its decoded size under --max-media-bytes, its alphabet and padding."""
    size = len(payload) * 3 // 4
    if size > policy.max_media_bytes:
        raise bad_media(
            f"{where} holds about {size:,} bytes of media, over --max-media-bytes "
            f"{policy.max_media_bytes:,}"
        )
    if not payload:
        raise bad_media(f"{where} holds no data")
    # Checked, not decoded: no copy of the media is made in the parent.
    bad_char = _NOT_BASE64.search(payload)
    if bad_char is not None:
        raise bad_media(
            f"{where} is not valid base64: {bad_char.group()!r} at character "
            f"{offset + bad_char.start()} is not a base64 digit"
        )
    # The padding is read in the last quantum alone: a search for the pattern at the end of the
    # payload tries it at every position (14 ms for a 250 KB image, 8 in 10 of a file of images'
    # validation time).
    end = len(payload)
    if (
        end % 4
        or _PADDING.fullmatch(payload, end - 4) is None
        or payload.find("=", 0, end - 2) >= 0
    ):
        raise bad_media(f"{where} is not valid base64: its length or padding is wrong")


def check_local_file(where: str, parsed: Any, policy: MediaPolicy) -> None:
    """A file:// URL: under --allowed-local-media-path, an existing file, not too big."""
    root = policy.allowed_local_media_path
    path = Path(unquote(parsed.path))
    if parsed.netloc not in ("", "localhost"):
        raise bad_media(f"{where} names a host ({parsed.netloc!r}); a file:// URL is file:///PATH")
    if root is None:
        raise bad_media(
            f"{where}: file:// URLs are refused unless --allowed-local-media-path names a "
            "directory they may read from"
        )
    resolved = Path(os.path.realpath(path))
    if not resolved.is_relative_to(Path(os.path.realpath(root))):
        raise bad_media(f"{where}: {path} is not under --allowed-local-media-path {root}")
    try:
        st = resolved.stat()
    except OSError as e:
        raise bad_media(f"{where}: cannot read {path}: {e.strerror or e}") from None
    if not resolved.is_file():
        raise bad_media(f"{where}: {path} is not a file")
    if st.st_size > policy.max_media_bytes:
        raise bad_media(
            f"{where}: {path} is {st.st_size:,} bytes, over --max-media-bytes "
            f"{policy.max_media_bytes:,}"
        )


def media_urls(body: dict[str, Any]) -> list[str]:
    """The URLs (and input_audio data) of a chat body's media parts, or a responses body's
    input_image parts, in order; a transcription's file_url."""
    found: list[str] = []
    if isinstance(body.get("file_url"), str):
        found.append(body["file_url"])
    messages = body.get("messages")
    if not isinstance(messages, list):
        messages = body.get("input")  # a responses body's input items
    for message in messages if isinstance(messages, list) else ():
        content = message.get("content") if isinstance(message, dict) else None
        for part in content if isinstance(content, list) else ():
            if not isinstance(part, dict):
                continue
            if part.get("type") == "input_image":
                if isinstance(part.get("image_url"), str):
                    found.append(part["image_url"])
                continue
            if part.get("type") not in MEDIA_PARTS:
                continue
            value = part.get(MEDIA_PARTS[str(part["type"])][1])
            url = value.get("url") if isinstance(value, dict) else value
            if isinstance(url, str):
                found.append(url)
            elif isinstance(value, dict) and isinstance(value.get("data"), str):
                found.append(value["data"])
    return found


def media_identity(body: dict[str, Any]) -> bytes:
    """What a body's file:// media are now (path, size and modification time of each), for keys
    that must tell two lines naming one path apart once the file changed; b"" when none."""
    marks: list[str] = []
    for url in media_urls(body):
        if not url.startswith("file:"):
            continue
        path = unquote(urlparse(url).path)
        try:
            st = os.stat(path)
        except OSError:
            marks.append(f"{path}\x00missing")
            continue
        marks.append(f"{path}\x00{st.st_size}\x00{st.st_mtime_ns}")
    return "\x1e".join(marks).encode()


def media_digest(url: str) -> str:
    """A short digest of a media URL or payload (a data URL's whole content), for plan keys."""
    return hashlib.blake2b(url.encode(), digest_size=8).hexdigest()
