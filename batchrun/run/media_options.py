"""The media options as typed (--allowed-local-media-path, --allowed-media-domains,
--limit-mm-per-prompt) made into a job's settings, and the settings made into the policy the
reader checks media parts against."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from batchrun.config import EngineSettings, OptionError
from batchrun.models.modalities import model_modalities
from batchrun.openai.media import MediaPolicy, parse_limits


def parse_media_root(value: str) -> str:
    """--allowed-local-media-path as an absolute path (checked to be a directory by the settings)."""
    if not value.strip():
        raise OptionError("--allowed-local-media-path", "must name a directory, not be empty")
    return os.path.abspath(os.path.expanduser(value))


def parse_domains(value: str) -> list[str]:
    """--allowed-media-domains: host names separated by commas, lowercased."""
    hosts = [h.strip().lower() for h in value.split(",") if h.strip()]
    if not hosts:
        raise OptionError("--allowed-media-domains", "names no host; give e.g. example.com")
    return hosts


def parse_limit_option(value: str) -> dict[str, int]:
    """--limit-mm-per-prompt, as vLLM takes it: image=2,audio=1 or {"image": 2}."""
    try:
        return dict(parse_limits(value))
    except ValueError as e:
        raise OptionError("--limit-mm-per-prompt", str(e)) from None


MEDIA_OPTION_PARSERS: dict[str, Callable[[Any], Any]] = {
    "allowed_local_media_path": parse_media_root,
    "allowed_media_domains": parse_domains,
    "limit_mm_per_prompt": parse_limit_option,
}


def media_policy_of(settings: EngineSettings) -> MediaPolicy:
    """The media policy a job's settings make."""
    limits = settings.limit_mm_per_prompt or {}
    modalities, name = model_modalities(settings)
    return MediaPolicy(
        allowed_local_media_path=settings.allowed_local_media_path,
        allowed_media_domains=tuple(settings.allowed_media_domains or ()),
        max_media_bytes=settings.max_media_bytes,
        limit_mm_per_prompt=tuple(sorted(limits.items())),
        model_modalities=modalities,
        model_name=name,
    )
