"""LoRA adapters (--lora-modules): parsed, checked before a job exists, fingerprinted, and what a
line's `body.model` resolves to.

An adapter is saved with the job as {"name", "path", "base_model_name", "fingerprint"}: the
fingerprint is a sha256 over the names, sizes and contents of the directory's files, taken at
submit and compared on every resume, so that a job's later answers come from the adapter its
first answers came from (a changed or missing directory is a one-line refusal naming it).

Nothing here imports vLLM, torch or safetensors: the parent reads adapter_config.json only.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

from batchrun.config import LORA_RANKS, EngineSettings, OptionError
from batchrun.errors import BatchrunError
from batchrun.models.config_file import model_config
from batchrun.openai.routing import KnownModels

# vLLM 0.32's LoRAConfig.max_lora_rank default, and the ranks it takes (MaxLoRARanks).
DEFAULT_MAX_LORA_RANK = 16
CONFIG_FILE = "adapter_config.json"
# The weight files vLLM loads from an adapter directory (one of them must be there).
WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin", "adapter_model.pt")
_HASH_BLOCK = 1 << 20

Adapter = dict[str, Any]


def parse_lora_modules(texts: list[str]) -> list[Adapter]:
    """The adapters of `--lora-modules` values: NAME=PATH, or vLLM's JSON form
    {"name", "path", "base_model_name"}; each path made absolute. OptionError (a usage error)
    for a value of neither form or a name given twice."""
    adapters: list[Adapter] = []
    for text in texts:
        adapter = _parse_one(text)
        if any(a["name"] == adapter["name"] for a in adapters):
            raise OptionError("--lora-modules", f"names the adapter {adapter['name']!r} twice")
        adapters.append(adapter)
    return adapters


def _parse_one(text: str) -> Adapter:
    stripped = text.strip()
    if stripped.startswith("{"):
        try:
            data = json.loads(stripped)
        except ValueError as e:
            raise OptionError("--lora-modules", f"is not valid JSON: {text!r} ({e})") from e
        if not isinstance(data, dict) or set(data) - {"name", "path", "base_model_name"}:
            raise OptionError(
                "--lora-modules",
                'takes JSON of the form {"name": ..., "path": ..., "base_model_name": ...}, '
                f"got {text!r}",
            )
        name, path, base = data.get("name"), data.get("path"), data.get("base_model_name")
        if base is not None and (not isinstance(base, str) or not base.strip()):
            raise OptionError("--lora-modules", f"base_model_name must be a name, got {base!r}")
    else:
        if "=" not in text:
            raise OptionError(
                "--lora-modules",
                f"takes NAME=PATH (or JSON with name and path), got {text!r}",
            )
        name, path = text.split("=", 1)
        name, base = name.strip(), None
    if not isinstance(name, str) or not name.strip():
        raise OptionError("--lora-modules", f"gives an adapter no name: {text!r}")
    if not isinstance(path, str) or not path.strip():
        raise OptionError("--lora-modules", f"gives the adapter {name!r} no path: {text!r}")
    return {
        "name": name,
        "path": str(Path(path).expanduser().absolute()),
        "base_model_name": base,
    }


def same_adapters(old: list[Adapter], new: list[Adapter]) -> bool:
    """Whether two adapter lists name the same adapters at the same places (fingerprints aside)."""

    def key(adapters: list[Adapter]) -> list[tuple[Any, ...]]:
        return [(a["name"], a["path"], a.get("base_model_name")) for a in adapters]

    return key(old) == key(new)


def merge_adapters(old: list[Adapter], new: list[Adapter]) -> list[Adapter]:
    """`new` (--lora-modules given to resume or retry-failed) over a job's saved adapters: the
    same names only (the job's lines were checked against them), each keeping its saved
    fingerprint, so that a moved directory is accepted only with the same files."""
    if [a["name"] for a in old] != [a["name"] for a in new]:
        names = ", ".join(a["name"] for a in old) or "none"
        raise OptionError(
            "--lora-modules",
            f"cannot change a job's adapter names (its lines were checked against them): the "
            f"job has {names}; give the same names, or submit a new job",
        )
    saved = {a["name"]: a.get("fingerprint") for a in old}
    return [{**a, "fingerprint": saved.get(a["name"])} for a in new]


def prepare_adapters(settings: EngineSettings) -> KnownModels | None:
    """Check each adapter's directory before a run (after prepare_model set the base model's
    served name), set its fingerprint or compare it with the one the job saved (a BatchrunError
    naming the adapter); returns the names lines may give (None: no adapters)."""
    check_adapters(
        settings.lora_modules, max_lora_rank=settings.max_lora_rank, base=settings.model_name
    )
    # A hub id's config is not read: an adapter that does not fit it is vLLM's to refuse.
    config = model_config(settings, hub=False) if settings.lora_modules else None
    if config is not None:
        for adapter in settings.lora_modules:
            check_fits_base(adapter, config, settings.model_name)
    return known_models(settings.model_name, settings.lora_modules)


def check_fits_base(adapter: Adapter, config: dict[str, Any], base: str) -> None:
    """Refuse an adapter made for another base model: a layer beyond the base's layers, or
    lora_A weights whose input size is none of the base's (hidden, intermediate, attention)
    sizes. Read from the weights' safetensors header only (a few kilobytes)."""
    shapes = _safetensors_shapes(Path(adapter["path"]) / WEIGHT_FILES[0])
    if shapes is None:
        return  # .bin / .pt weights: not read here; vLLM checks them when it loads them
    layers = config.get("num_hidden_layers")
    hidden = config.get("hidden_size")
    heads, head_dim = config.get("num_attention_heads"), config.get("head_dim")
    sizes = {hidden, config.get("intermediate_size")}
    if isinstance(heads, int) and isinstance(head_dim, int):
        sizes.add(heads * head_dim)
    name = adapter["name"]
    for key, shape in shapes.items():
        layer = _LAYER.search(key)
        if layer is not None and isinstance(layers, int) and int(layer.group(1)) >= layers:
            raise BatchrunError(
                f"adapter {name!r} does not fit the base model {base}: it has weights for layer "
                f"{layer.group(1)}, the model has {layers} layers (an adapter of another model?)"
            )
        lora_a = key.endswith("lora_A.weight") and len(shape) == 2
        if lora_a and isinstance(hidden, int) and shape[1] not in sizes:
            raise BatchrunError(
                f"adapter {name!r} does not fit the base model {base}: {key} takes inputs "
                f"of size {shape[1]}, the model's hidden size is {hidden} (an adapter of "
                "another model?)"
            )


_LAYER = re.compile(r"\.layers\.(\d+)\.")


def _safetensors_shapes(path: Path) -> dict[str, list[int]] | None:
    """Each tensor's shape from a safetensors file's JSON header; None if there is no such file
    or it is not one (vLLM then says what is wrong)."""
    try:
        with path.open("rb") as f:
            size = int.from_bytes(f.read(8), "little")
            if not 0 < size <= 100 * 2**20:
                return None
            header = json.loads(f.read(size))
    except (OSError, ValueError):
        return None
    if not isinstance(header, dict):
        return None
    return {
        k: v["shape"]
        for k, v in header.items()
        if k != "__metadata__" and isinstance(v, dict) and isinstance(v.get("shape"), list)
    }


def check_adapters(adapters: list[Adapter], *, max_lora_rank: int | None, base: str) -> None:
    """Check each adapter's directory and set (or compare) its fingerprint.

    `base`: the job's base model's served name, which a JSON form's base_model_name must give.
    """
    rank_limit = max_lora_rank if max_lora_rank is not None else DEFAULT_MAX_LORA_RANK
    for adapter in adapters:
        name, path = adapter["name"], Path(adapter["path"])
        config = _read_config(name, path)
        wanted = adapter.get("base_model_name")
        if wanted is not None and wanted != base:
            raise BatchrunError(
                f"adapter {name!r} is for the base model {wanted!r}, but the job runs {base!r}"
            )
        rank = config.get("r")
        if isinstance(rank, int) and rank > rank_limit:
            raise BatchrunError(
                f"adapter {name!r} ({path}) has rank {rank}, above --max-lora-rank {rank_limit}; "
                f"pass --max-lora-rank {_rank_at_least(rank)}"
            )
        fingerprint = fingerprint_dir(path)
        saved = adapter.get("fingerprint")
        if saved is not None and saved != fingerprint:
            raise BatchrunError(
                f"adapter {name!r}: the files in {path} changed since the job was submitted; "
                "restore them, or submit a new job"
            )
        adapter["fingerprint"] = fingerprint


def _rank_at_least(rank: int) -> int:
    return next((r for r in LORA_RANKS if r >= rank), LORA_RANKS[-1])


def _read_config(name: str, path: Path) -> dict[str, Any]:
    """The adapter's adapter_config.json, or a BatchrunError saying what is missing."""
    if not path.is_dir():
        what = "is not a directory" if path.exists() else "does not exist"
        raise BatchrunError(f"adapter {name!r}: {path} {what}")
    config_path = path / CONFIG_FILE
    try:
        data = json.loads(config_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BatchrunError(
            f"adapter {name!r}: {path} has no {CONFIG_FILE} (not a LoRA adapter directory)"
        ) from None
    except OSError as e:
        raise BatchrunError(
            f"adapter {name!r}: cannot read {config_path}: {e.strerror or e}"
        ) from e
    except ValueError as e:
        raise BatchrunError(f"adapter {name!r}: {config_path} is not valid JSON ({e})") from e
    if not isinstance(data, dict):
        raise BatchrunError(f"adapter {name!r}: {config_path} is not a JSON object")
    if not any((path / f).is_file() for f in WEIGHT_FILES):
        raise BatchrunError(
            f"adapter {name!r}: {path} has no weights ({' or '.join(WEIGHT_FILES)})"
        )
    return data


def fingerprint_dir(path: Path) -> str:
    """A sha256 over the relative names, sizes and contents of the files under `path`."""
    digest = hashlib.sha256()
    try:
        files = sorted(p for p in path.rglob("*") if p.is_file())
        for file in files:
            digest.update(str(file.relative_to(path)).encode("utf-8", "surrogateescape") + b"\0")
            digest.update(str(file.stat().st_size).encode() + b"\0")
            with file.open("rb") as f:
                while block := f.read(_HASH_BLOCK):
                    digest.update(block)
    except OSError as e:
        raise BatchrunError(f"cannot read the adapter directory {path}: {e.strerror or e}") from e
    return digest.hexdigest()


def known_models(base: str, adapters: list[Adapter]) -> KnownModels | None:
    """The names a line's body.model may give when adapters are configured (the base model's
    served name and each adapter's); None without adapters (one name per file, any name)."""
    if not adapters:
        return None
    return KnownModels(base, tuple(a["name"] for a in adapters))
