"""The engines batchrun knows, by name: the one place that says what an engine name means.

Each entry says how the engine's model is prepared, which device its cached batch sizes are keyed
by, whether its workers are laid out over GPUs, and where its class is. The entries hold names and
import paths, never classes: the command line reads this module (for `--engine`'s choices and
help), and must never import vLLM or torch. Only `EngineSpec.factory()`, called in a worker
process, imports the engine's module.

Adding an engine is one entry here (and its module under `batchrun/engines/`). It lives outside
engines/, beside config.py, because the settings (`EngineSettings.engine`, `.spec`) read it and
the engines import the settings.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from batchrun.errors import OptionError

# How an engine's model is prepared before its workers start:
# "none": the engine loads no model; --served-model-name, else --model if given (a path's name, or
#   the value as given: a hub id), names the responses' `model`, else the engine's name does.
# "huggingface": what vLLM loads (batchrun/models/): a hub id, found in the Hugging Face cache
#   or downloaded; a local Hugging Face model directory; a .gguf file or the embedded default
#   model, converted once in a child process.
# "remote": the server at --base-url serves it; --served-model-name, else the one model its
#   /v1/models lists, fills a line's missing body.model (batchrun/engines/remote/).
ModelSource = Literal["none", "huggingface", "remote"]


@dataclass(frozen=True)
class EngineSpec:
    """One engine: everything outside the engine's own module that depends on which one it is."""

    name: str
    # For --engine's help: what sets it apart ("" when nothing needs saying).
    summary: str
    # "module:attribute" of a class (or function) taking EngineSettings and returning an Engine.
    factory_path: str
    model: ModelSource
    # The device its cached batch sizes are keyed by; None: each worker's GPUs (cuda:<name>
    # <memory>, MIG profile), or cpu, since the best size depends on the memory the engine runs in.
    cache_device: str | None
    # True: one worker per GPU (or tensor-parallel group), on the CPU when there is no GPU, and
    # named GPUs must hold one tensor-parallel group. False: `--workers` plain processes (default
    # 1), no GPU taken.
    uses_gpus: bool
    # "module:function" listing the engine's reasoning parsers (--reasoning-parser's choices);
    # None: the engine splits no reasoning, and takes any name.
    reasoning_parsers_path: str | None = None
    # True: the engine finds how many requests to keep in flight itself (the remote engine's
    # AIMD window); the batch size is its cap (--max-concurrency), never searched, and what
    # the job shows as its batch size is the window the engine settled on.
    flow_control: bool = False

    def factory(self) -> Callable[[Any], Any]:
        """The engine's class (imports its module: call it in a worker, never in the CLI)."""
        module, _, attribute = self.factory_path.partition(":")
        found: Callable[[Any], Any] = getattr(importlib.import_module(module), attribute)
        return found

    def check_reasoning_parser(self, name: str) -> None:
        """Refuse a --reasoning-parser the engine does not have (an OptionError listing those it
        has), before any job exists. The first time for an installed build it imports the
        engine's parser registry (vLLM's: about 4 s); later commands read the names remembered
        (engines/names_cache.py)."""
        if self.reasoning_parsers_path is None:
            return
        module, _, attribute = self.reasoning_parsers_path.partition(":")
        try:
            names: list[str] = getattr(importlib.import_module(module), attribute)()
        except ImportError:  # the engine's package is not here: its worker will say so
            return
        if name not in names:
            raise OptionError(
                "--reasoning-parser",
                f"names no reasoning parser of {self.name}'s, got {name!r}; it has "
                f"{', '.join(names)}",
            )


_SPECS = (
    EngineSpec(
        name="vllm",
        summary="",
        factory_path="batchrun.engines.vllm.engine:VllmEngine",
        model="huggingface",
        cache_device=None,
        uses_gpus=True,
        reasoning_parsers_path="batchrun.engines.vllm.reasoning:parser_names",
    ),
    EngineSpec(
        name="echo",
        summary="no model: replies with the input",
        factory_path="batchrun.engines.echo:EchoEngine",
        model="none",
        cache_device="echo",
        uses_gpus=False,
    ),
    EngineSpec(
        name="remote",
        summary="an OpenAI-compatible server at --base-url",
        factory_path="batchrun.engines.remote.engine:RemoteEngine",
        model="remote",
        cache_device="remote",
        uses_gpus=False,
        flow_control=True,
    ),
)
ENGINES: dict[str, EngineSpec] = {spec.name: spec for spec in _SPECS}
# In the order choices are shown and named in messages; the first is the default.
ENGINE_NAMES: tuple[str, ...] = tuple(ENGINES)
DEFAULT_ENGINE = ENGINE_NAMES[0]


def engine_spec(name: object) -> EngineSpec:
    """The engine called `name`; an OptionError naming --engine when there is none."""
    spec = ENGINES.get(name) if isinstance(name, str) else None
    if spec is None:
        raise OptionError("--engine", f"must be one of {', '.join(ENGINE_NAMES)}, got {name!r}")
    return spec


def engine_help() -> str:
    """--engine's help: `vllm, or echo (no model: replies with the input).`"""
    shown = [f"{s.name} ({s.summary})" if s.summary else s.name for s in _SPECS]
    listed = shown[0] if len(shown) == 1 else f"{', '.join(shown[:-1])}, or {shown[-1]}"
    return listed + "."


def engine_choice() -> Any:
    """The type of --engine's value: a Literal of the names (Typer takes its choices from it)."""
    return Literal[ENGINE_NAMES]  # type: ignore[valid-type]
