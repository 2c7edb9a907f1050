"""GET /v1/models: the models a batch's lines may name in body.model, in OpenAI's list shape
({"object": "list", "data": [{"id", "object": "model", "created", "owned_by", ...}]}): the base
model, then each LoRA adapter with `parent` naming its base model, as vLLM's server lists them."""

from __future__ import annotations

from typing import Any

from batchrun.config import EngineSettings

OWNED_BY = "batchrun"


def model_list(settings: EngineSettings, created: int) -> dict[str, Any]:
    """The /v1/models answer for a server running `settings` (started at `created`)."""
    base = settings.model_name
    data = [model_entry(base, created, root=settings.model or base)]
    data += [
        model_entry(a["name"], created, root=a["path"], parent=a.get("base_model_name") or base)
        for a in settings.lora_modules
    ]
    return {"object": "list", "data": data}


def model_entry(name: str, created: int, *, root: str, parent: str | None = None) -> dict[str, Any]:
    """One model's entry: a base model (`parent` None) or an adapter of `parent`."""
    return {
        "id": name,
        "object": "model",
        "created": created,
        "owned_by": OWNED_BY,
        "root": root,
        "parent": parent,
    }
