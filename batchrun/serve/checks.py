"""The checks of POST /v1/batches that need no job: completion window, metadata, endpoint."""

from __future__ import annotations

import json
import re
from pathlib import Path

from batchrun.openai.records import SUPPORTED_ENDPOINTS
from batchrun.serve.batches import PRIORITIES
from batchrun.serve.errors import ApiError

_WINDOW = re.compile(r"([1-9][0-9]{0,8})([smhd])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
# How far into an input file the endpoint check looks for a line naming its url.
SCAN_LINES = 1000


def window_seconds(window: str) -> int:
    """`24h` (OpenAI's only value), or another duration (`90s`, `30m`, `1h`, `2d`): an extension."""
    match = _WINDOW.fullmatch(window)
    if match is None:
        raise ApiError(
            400,
            f"completion_window must be a duration such as 24h, 1h, 30m or 90s, got {window!r}",
            param="completion_window",
        )
    return int(match[1]) * _UNIT_S[match[2]]


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
    the batch's priority (`metadata.priority`: high, normal or low; normal when absent)."""
    if metadata is None:
        return "normal"
    if len(metadata) > 16:
        raise ApiError(400, "metadata holds at most 16 keys", param="metadata")
    for key, value in metadata.items():
        if len(key) > 64 or len(value) > 512:
            raise ApiError(
                400, "metadata keys are at most 64 characters, values 512", param="metadata"
            )
    priority = metadata.get("priority", "normal")
    if priority not in PRIORITIES:
        raise ApiError(
            400,
            f"metadata.priority must be high, normal or low, got {priority!r}",
            param="metadata",
        )
    return priority


def check_file_endpoint(path: Path, endpoint: str) -> None:
    """Refuse a batch whose input's requests name another url than `endpoint` (the first line
    that names one decides; lines that name none are left to validation)."""
    with path.open("rb") as f:
        for _, raw in zip(range(SCAN_LINES), f, strict=False):
            try:
                line = json.loads(raw)
            except ValueError:
                continue
            url = line.get("url") if isinstance(line, dict) else None
            if isinstance(url, str):
                if url != endpoint:
                    raise ApiError(
                        400,
                        f"the input file's requests use {url}, not the batch's endpoint {endpoint}",
                        param="endpoint",
                    )
                return
