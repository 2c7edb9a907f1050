"""The checks of POST /v1/batches that need no job: completion window, metadata (and the
priority it gives), endpoint, output expiry; and the model the input's lines name."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from batchrun.openai.records import SUPPORTED_ENDPOINTS
from batchrun.serve.batches import PRIORITIES
from batchrun.serve.errors import ApiError

_WINDOW = re.compile(r"([1-9][0-9]{0,8})([smhd])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
# The longest completion window batchrun takes (OpenAI takes only 24h): a year is beyond any
# batch, and a bound keeps expires_at a time that means something.
MAX_WINDOW_S = 365 * 86400
# How far into an input file the endpoint check looks for a line naming its url (and the
# batch's model for a line naming one).
SCAN_LINES = 1000
# OpenAI's limits on a batch's metadata: keys, a key's characters, a value's characters.
MAX_METADATA_KEYS, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512
# The metadata keys that steer the queue, the first holding a known priority winning:
# batchrun's own key (namespaced: no other client's tag means it), then OpenAI clients' common
# `priority` tag (docs/serve.md).
PRIORITY_KEYS = ("batchrun_priority", "priority")


def window_seconds(window: str) -> int:
    """`24h` (OpenAI's only value), or another duration (`90s`, `30m`, `1h`, `2d`): an extension."""
    match = _WINDOW.fullmatch(window)
    if match is None:
        raise ApiError(
            400,
            f"completion_window must be a duration such as 24h, 1h, 30m or 90s, got {window!r}",
            param="completion_window",
        )
    seconds = int(match[1]) * _UNIT_S[match[2]]
    if seconds > MAX_WINDOW_S:
        raise ApiError(
            400,
            f"completion_window must be at most 365d ({MAX_WINDOW_S} seconds), got {window!r}",
            param="completion_window",
        )
    return seconds


# OpenAI's longest output expiry (30 days). Its shortest is an hour; batchrun takes any number of
# seconds from 1, as it takes completion windows shorter than OpenAI's (an extension).
MAX_EXPIRY_S = 30 * 86400


def expiry_seconds(
    expires_after: dict[str, Any] | None, name: str = "output_expires_after"
) -> int | None:
    """The seconds after their creation that a batch's output and error files (or, as `name`
    says, an uploaded file) are deleted (`{"anchor": "created_at", "seconds": N}`); None: kept."""
    if expires_after is None:
        return None
    anchor, seconds = expires_after.get("anchor"), expires_after.get("seconds")
    if anchor != "created_at":
        raise ApiError(
            400,
            f"{name}.anchor must be 'created_at', got {anchor!r}",
            param=f"{name}.anchor",
        )
    if set(expires_after) != {"anchor", "seconds"}:
        extra = sorted(set(expires_after) - {"anchor", "seconds"})
        raise ApiError(
            400,
            f"{name} takes anchor and seconds only, got {', '.join(extra) or 'no seconds'}",
            param=name,
        )
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, int)
        or not 1 <= seconds <= MAX_EXPIRY_S
    ):
        raise ApiError(
            400,
            f"{name}.seconds must be an integer from 1 to {MAX_EXPIRY_S}, got {seconds!r}",
            param=f"{name}.seconds",
        )
    return seconds


_EXPIRY_FIELD = re.compile(r"expires_after\[(\w+)\]")


def file_expiry(fields: dict[str, str]) -> int | None:
    """The seconds after which an uploaded file is deleted, from its form fields as the openai
    client sends them (`expires_after[anchor]`, `expires_after[seconds]`); None: kept."""
    given: dict[str, Any] = {}
    for key, value in fields.items():
        if (match := _EXPIRY_FIELD.fullmatch(key)) is not None:
            given[match[1]] = int(value) if value.isdigit() and len(value) < 12 else value
        elif key.startswith("expires_after"):
            raise ApiError(
                400, f"Unrecognized request argument supplied: {key}", param="expires_after"
            )
    return expiry_seconds(given, "expires_after") if given else None


def check_endpoint(endpoint: str) -> None:
    """Refuse an endpoint batchrun does not run."""
    if endpoint not in SUPPORTED_ENDPOINTS:
        raise ApiError(
            400,
            f"endpoint must be one of {', '.join(SUPPORTED_ENDPOINTS)}, got {endpoint!r}",
            param="endpoint",
        )


def check_metadata(metadata: dict[str, str] | None) -> str:
    """Refuse metadata OpenAI would (16 keys, 64-character keys, 512-character values); return
    the batch's priority in the queue. Metadata is otherwise free-form: `batchrun_priority`,
    then `priority`, steer the queue when one holds a value batchrun knows (high, normal, low);
    any other value of either is kept and shown, never refused (normal then)."""
    if metadata is None:
        return "normal"
    if len(metadata) > MAX_METADATA_KEYS:
        raise ApiError(400, "metadata holds at most 16 keys", param="metadata")
    for key, value in metadata.items():
        if len(key) > MAX_METADATA_KEY or len(value) > MAX_METADATA_VALUE:
            raise ApiError(
                400, "metadata keys are at most 64 characters, values 512", param="metadata"
            )
    for key in PRIORITY_KEYS:
        if metadata.get(key) in PRIORITIES:
            return metadata[key]
    return "normal"


def _first_lines(path: Path) -> Iterator[object]:
    """The first SCAN_LINES lines of a batch's input, parsed; a line JSON cannot read is
    skipped (left to validation, which says why)."""
    with path.open("rb") as f:
        for _, raw in zip(range(SCAN_LINES), f, strict=False):
            try:
                line = json.loads(raw)
            except (ValueError, RecursionError):
                continue
            yield line


def batch_model(path: Path) -> str | None:
    """The model a batch's lines name, as OpenAI's Batch object shows it: the first line's
    `body.model` (of the first SCAN_LINES lines, the first that names one); None when none does."""
    for line in _first_lines(path):
        body = line.get("body") if isinstance(line, dict) else None
        model = body.get("model") if isinstance(body, dict) else None
        if isinstance(model, str) and model:
            return model
    return None


def check_file_endpoint(path: Path, endpoint: str) -> None:
    """Refuse a batch whose input's requests name another url than `endpoint` (the first line
    that names one decides; lines that name none are left to validation)."""
    for line in _first_lines(path):
        url = line.get("url") if isinstance(line, dict) else None
        if isinstance(url, str):
            if url != endpoint:
                raise ApiError(
                    400,
                    f"the input file's requests use {url}, not the batch's endpoint {endpoint}",
                    param="endpoint",
                )
            return
