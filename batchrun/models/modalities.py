"""What a job's model reads (text, image, audio, video), known from its config.json before any
engine starts, so that a media part the model cannot take is an error record when the input is
validated (the worker checks again with vLLM's own answer, engines/vllm/media.py).

vLLM decides it from the model's architecture: an architecture in its registry of text generation
models reads text only; a multimodal one reads what its processor's `get_supported_mm_limits`
names. The first is read from the installed vLLM's registry source (parsed, never imported: this
process owns the journal and never loads vLLM); the second from a table of common architectures,
copied from vLLM 0.32's processors. Anything else is unknown (None) and left to the worker.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from batchrun.errors import BatchrunError

if TYPE_CHECKING:
    from batchrun.config import EngineSettings

# vLLM 0.32's `get_supported_mm_limits` of common multimodal architectures (the media they read).
MULTIMODAL_ARCHITECTURES: dict[str, tuple[str, ...]] = {
    "Gemma3ForConditionalGeneration": ("image",),
    "Idefics3ForConditionalGeneration": ("image",),
    "LlavaForConditionalGeneration": ("image",),
    "LlavaNextForConditionalGeneration": ("image",),
    "LlavaOnevisionForConditionalGeneration": ("image", "video"),
    "Mistral3ForConditionalGeneration": ("image",),
    "PaliGemmaForConditionalGeneration": ("image",),
    "Phi4MMForCausalLM": ("audio", "image"),
    "PixtralForConditionalGeneration": ("image",),
    "Qwen2AudioForConditionalGeneration": ("audio",),
    "Qwen2VLForConditionalGeneration": ("image", "video"),
    "Qwen2_5_VLForConditionalGeneration": ("image", "video"),
    "SmolVLMForConditionalGeneration": ("image",),
    "UltravoxModel": ("audio",),
    "WhisperForConditionalGeneration": ("audio",),
}
# The embedded default model (SmolLM2-135M-Instruct) reads text only.
DEFAULT_MODEL_MODALITIES = ("text",)


def config_modalities(config: dict[str, Any]) -> tuple[str, ...] | None:
    """What a model with this config.json reads ("text" first), as vLLM would take it; None
    when batchrun cannot tell before the engine starts."""
    architectures = config.get("architectures")
    if not isinstance(architectures, list) or not architectures:
        return None
    arch = architectures[0]
    if not isinstance(arch, str):
        return None
    if arch in MULTIMODAL_ARCHITECTURES:
        return ("text", *MULTIMODAL_ARCHITECTURES[arch])
    text_only, multimodal = _vllm_registry()
    if arch in text_only and arch not in multimodal:
        return ("text",)
    return None


def directory_modalities(directory: Path) -> tuple[str, ...] | None:
    """What the model in a Hugging Face directory reads (None: no readable config.json, or
    not known before the engine starts)."""
    try:
        config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # the model's own check (prepare_model) or vLLM says what is wrong
    return config_modalities(config) if isinstance(config, dict) else None


@functools.cache
def _vllm_registry() -> tuple[frozenset[str], frozenset[str]]:
    """The architecture names of vLLM's text generation and multimodal registries, read from
    the installed vLLM's source (empty when there is none, or its shape has changed)."""
    spec = importlib.util.find_spec("vllm")  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        return frozenset(), frozenset()
    path = Path(next(iter(spec.submodule_search_locations)))
    source = path / "model_executor" / "models" / "registry.py"
    try:
        tree = ast.parse(source.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return frozenset(), frozenset()
    found: dict[str, frozenset[str]] = {}
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id in ("_TEXT_GENERATION_MODELS", "_MULTIMODAL_MODELS")
            and isinstance(node.value, ast.Dict)
        ):
            keys = node.value.keys
            found[node.targets[0].id] = frozenset(
                k.value for k in keys if isinstance(k, ast.Constant) and isinstance(k.value, str)
            )
    return (
        found.get("_TEXT_GENERATION_MODELS", frozenset()),
        found.get("_MULTIMODAL_MODELS", frozenset()),
    )


def model_modalities(settings: EngineSettings) -> tuple[tuple[str, ...] | None, str]:
    """What a job's --model reads and the name messages give it (its served name, else the
    directory's or the hub id); (None, name) when not known before the engine starts, or when
    the job has several models."""
    from batchrun.models import (
        DEFAULT_MODEL_NAME,
        check_gguf,
        gguf_model_dir,
        gguf_model_ready,
        model_kind,
    )

    model = settings.model
    name = settings.served_model_name or (Path(model).name if model else DEFAULT_MODEL_NAME)
    if settings.spec.model != "huggingface":  # echo, or a server's model: any part goes
        return None, name
    if len(settings.models) > 1:
        # Several models: what reads a line's part depends on its body.model, which this
        # process-wide check does not see; each model's worker refuses what it cannot read.
        return None, name
    try:
        kind = model_kind(model)
        if kind == "default":
            return DEFAULT_MODEL_MODALITIES, name
        assert model is not None
        if kind == "directory":
            return directory_modalities(Path(model).expanduser()), name
        if kind == "gguf":
            gguf = check_gguf(model)
            # Only a finished conversion is read: converting (torch) is never done here.
            ready = gguf_model_ready(gguf)
            return (directory_modalities(gguf_model_dir(gguf)) if ready else None), name
        return _hub_modalities(model, settings.revision), model
    except BatchrunError:
        return None, name  # prepare_model refuses the --model value with its own message


def _hub_modalities(repo_id: str, revision: str | None) -> tuple[str, ...] | None:
    """What a hub model reads, from its config.json in the Hugging Face cache (never fetched)."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo_id, "config.json", revision=revision)
    return directory_modalities(Path(found).parent) if isinstance(found, str) else None


def served_modalities(settings: EngineSettings) -> list[str] | None:
    """What `serve`'s model reads, for its /v1/models entries (None: not known from its config)."""
    reads, _ = model_modalities(settings)
    return list(reads) if reads is not None else None
