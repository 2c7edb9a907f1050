"""GET /v1/models: the models a batch's lines may name in body.model, in OpenAI's list shape
({"object": "list", "data": [{"id", "object": "model", "created", "owned_by", ...}]}): the base
model(s), then each LoRA adapter with `parent` naming its base model, as vLLM's server lists
them. GET /v1/models/{id} answers one of them, or OpenAI's 404 `model_not_found`."""

from __future__ import annotations

from typing import Any

from batchrun.config import EngineSettings
from batchrun.models.modalities import served_modalities
from batchrun.models.named import adapters_of, model_names, settings_for
from batchrun.serve.errors import ApiError

OWNED_BY = "batchrun"


def model_list(settings: EngineSettings, created: int) -> dict[str, Any]:
    """The /v1/models answer for a server running `settings` (started at `created`): each base
    model (several with `--model NAME=PATH` repeated), then each adapter with its `parent`."""
    data: list[dict[str, Any]] = []
    adapters: list[dict[str, Any]] = []
    for base in model_names(settings):
        one = settings_for(settings, base)
        reads = served_modalities(one)  # an adapter reads what its base model reads
        data.append(model_entry(base, created, root=one.model or base, modalities=reads))
        # One model: every adapter is its, under the base name its JSON form gives, if any.
        mine = adapters_of(settings, base) if settings.models else settings.lora_modules
        adapters += [
            model_entry(
                a["name"],
                created,
                root=a["path"],
                parent=a.get("base_model_name") or base,
                modalities=reads,
            )
            for a in mine
        ]
    return {"object": "list", "data": data + adapters}


def model_entry(
    name: str,
    created: int,
    *,
    root: str,
    parent: str | None = None,
    modalities: list[str] | None = None,
) -> dict[str, Any]:
    """One model's entry: a base model (`parent` None) or an adapter of `parent`; with
    `modalities` (what it reads, e.g. ["text", "image"]) when its config says so."""
    entry: dict[str, Any] = {
        "id": name,
        "object": "model",
        "created": created,
        "owned_by": OWNED_BY,
        "root": root,
        "parent": parent,
    }
    if modalities is not None:
        # Neither OpenAI's Model nor vLLM's ModelCard has such a field; the name and values
        # are those of OpenAI's chat request field `modalities`.
        entry["modalities"] = modalities
    return entry


def unknown_model(model_id: str) -> ApiError:
    """OpenAI's 404 for a model id that is not listed (its code `model_not_found`)."""
    return ApiError(
        404,
        f"The model `{model_id}` does not exist: GET /v1/models lists this server's models",
        code="model_not_found",
    )
