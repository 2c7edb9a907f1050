"""The engine interface: start with settings, take requests, yield outcomes as they finish, close.

An engine lives inside a worker process (see `worker.py`); the process that owns the journal never
imports one. Engines are step-driven so that the worker can keep a window of requests in flight and
top it up as each one finishes, instead of waiting for the slowest member of a batch.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from batchrun.config import EngineSettings
from batchrun.engine_registry import engine_spec
from batchrun.openai.records import Outcome, Request


class Engine(Protocol):
    """A running engine. Not thread-safe; used from one loop in the worker process."""

    def add(self, request: Request) -> Outcome | None:
        """Queue a request; return an Outcome at once if it cannot run (a per-request error)."""
        ...

    def step(self) -> list[Outcome]:
        """Advance the engine; return the outcomes of requests that finished in this step."""
        ...

    def has_unfinished(self) -> bool:
        """Whether any added request has not finished yet."""
        ...

    def close(self) -> None:
        """Release the engine's resources."""
        ...


@runtime_checkable
class CacheCounting(Protocol):
    """An engine with a prefix cache that counts its lookups (vLLM); the echo engine has none."""

    def prefix_cache_counters(self) -> tuple[int, int]:
        """Prompt tokens looked up in the prefix cache since the engine started, and of those
        the ones found cached (the engine's own counters)."""
        ...


@runtime_checkable
class KvCacheSized(Protocol):
    """An engine whose prefix cache has a known size (vLLM); the planner's admission keeps the
    prefixes a worker holds within it (run/admission.py)."""

    def kv_cache_size(self) -> tuple[int, int] | None:
        """The KV cache's size in tokens, and the tokens of one block; None when it caches no
        prefixes (prefix caching off, a pooling model)."""
        ...


@runtime_checkable
class Abortable(Protocol):
    """An engine that can drop a running request (vLLM, echo): `--request-timeout` aborts it
    there; without this, the worker is replaced to free the request's place."""

    def abort(self, custom_id: str) -> None:
        """Stop running a request added with this id; its outcome is the caller's to record.
        An id not running is ignored."""
        ...


@runtime_checkable
class FlowControlled(Protocol):
    """An engine that finds by itself how many requests to keep in flight (the remote engine's
    AIMD window): the worker hands it all its window holds, reports its window as the batch
    size, and leaves `--request-timeout` to it (time waiting for its window is not the
    server's)."""

    def flow_window(self) -> int:
        """The requests it lets be in flight now."""
        ...


class StopsJob(RuntimeError):
    """An engine error that no restart, retry or other request cures (a server refusing the
    key): the job stops, with this message, everything answered kept."""


def create_engine(settings: EngineSettings) -> Engine:
    """Start the engine that `settings.engine` names (see engine_registry.py); this imports the
    engine's module (vLLM's only for the vllm engine). An unknown name is an OptionError."""
    engine: Engine = engine_spec(settings.engine).factory()(settings)
    return engine
