"""A model's config.json as the parent can read it without loading the model: the embedded
default model's conversion, a local directory, or a hub snapshot already in the cache."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from batchrun.cache_home import cache_root
from batchrun.config import EngineSettings
from batchrun.models.convert import DEFAULT_MODEL_NAME


def model_config(settings: EngineSettings, *, hub: bool = True) -> dict[str, Any] | None:
    """The config.json of `settings`' model once prepare_model has found it; None for a .gguf
    file, an engine that loads no model (or a remote one), a hub id when `hub` is False or its
    snapshot lacks the file, or a file that does not parse (vLLM will say what is wrong)."""
    if settings.spec.model != "huggingface":
        return None
    if settings.model is None:
        path: Path | None = cache_root() / "models" / DEFAULT_MODEL_NAME / "config.json"
    elif Path(settings.model).is_dir():
        path = Path(settings.model) / "config.json"
    elif hub and settings.model_commit is not None:
        path = _hub_file(settings.model, settings.model_commit)
    else:
        return None
    if path is None:
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def vocab_size(settings: EngineSettings) -> int | None:
    """The model's vocabulary size as vLLM reads it (the text model's, for a multimodal one);
    None where its config.json is not at hand."""
    config = model_config(settings)
    if config is None:
        return None
    text = config.get("text_config")
    size = (text if isinstance(text, dict) and "vocab_size" in text else config).get("vocab_size")
    return size if type(size) is int and size > 0 else None


def _hub_file(repo_id: str, commit: str) -> Path | None:
    """config.json of a hub repo's snapshot at `commit`, if huggingface_hub's cache holds it."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo_id, "config.json", revision=commit)
    return Path(found) if isinstance(found, str) else None
