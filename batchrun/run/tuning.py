"""Drive the batch-size search with probes made of the job's own requests (nothing is wasted)."""

from __future__ import annotations

import fcntl
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from batchrun.cache_home import cache_root
from batchrun.config import EngineSettings
from batchrun.console.text import plural
from batchrun.errors import BatchrunError, GaveUp
from batchrun.job.files import write_json_atomic
from batchrun.openai.records import POOLING_ENDPOINTS, Request
from batchrun.run.reporting import Reporter
from batchrun.run.scheduler import Scheduler
from batchrun.run.sizing import BatchSizeSearch, Probe

DEFAULT_MIN_BATCH = 8
DEFAULT_MAX_BATCH = 256
# A probe runs this many batches' worth of requests, so that it measures the steady state.
PROBE_BATCHES = 2
MIN_PROBE_REQUESTS = 16


@dataclass
class TuneResult:
    """The chosen batch size and every probe behind it."""

    size: int
    probes: list[Probe] = field(default_factory=list)
    source: str = "search"  # "search", "cache", "fixed" or "job"


def search_batch_size(
    scheduler: Scheduler,
    source: Iterator[Request],
    reporter: Reporter,
    lo: int = DEFAULT_MIN_BATCH,
    hi: int = DEFAULT_MAX_BATCH,
    pooling: bool = False,
) -> TuneResult:
    """Binary-search the batch size on the job's own requests; what the probes finish is kept.

    Each probe is measured by the endpoint's work: generated tokens per second, or, for a
    `pooling` job (embeddings, score, rerank: no token generated), prompt tokens per second; a
    pooling job keeps the largest size that runs (run/sizing.py: it has no knee).
    """
    search = BatchSizeSearch(lo, hi, walk_down=not pooling)
    unit = "prompt tok/s" if pooling else "generated tok/s"
    while (size := search.next_size()) is not None:
        scheduler.resize(size)
        limit = max(PROBE_BATCHES * size, MIN_PROBE_REQUESTS)
        reporter.event(f"probing batch size {size} on {plural(limit, 'request')}")
        stats = scheduler.run(source, limit=limit, stop_on_oom=True)
        probe = Probe(
            size=size,
            ok=not stats.oom,
            requests=stats.outcomes,
            seconds=round(stats.seconds, 3),
            tokens_per_s=round(stats.prompt_tokens_per_s if pooling else stats.tokens_per_s, 2),
            peak_memory_mb=scheduler.peak_memory_mb(),
            note="out of memory" if stats.oom else "",
            unit=unit,
        )
        search.report(probe)
        reporter.event(
            f"probe size {size}: "
            + (
                "out of memory"
                if stats.oom
                else f"{probe.tokens_per_s:.1f} {unit} on {plural(stats.outcomes, 'request')}"
            )
        )
        if not stats.oom and stats.outcomes < limit:
            break  # the job ran out of requests: measuring further would measure nothing
    best = search.best()
    if best is None:
        raise GaveUp(
            f"out of memory at every batch size down to {lo}; lower --max-model-len or "
            "--gpu-memory-utilization, or use a smaller model. Everything finished so far is saved"
        )
    scheduler.resize(best.size)
    return TuneResult(size=best.size, probes=search.probes)


def cache_key(settings: EngineSettings, device: str) -> str:
    """What a cached batch size depends on: model, device, max model length, engine, the memory
    given to the engine (its fraction, or a KV cache budget in bytes), and the endpoint
    (embeddings, score and rerank run vLLM as a pooling model, whose memory and best size
    differ)."""
    key: list[object] = [
        settings.engine,
        settings.model or "default",
        device,
        settings.max_model_len,
        settings.tensor_parallel_size,
        settings.gpu_memory_utilization,
    ]
    if settings.endpoint in POOLING_ENDPOINTS:
        key.append("pooling")  # generation keys unchanged: sizes cached before stay valid
    if settings.kv_cache_memory_bytes is not None:
        # A job with its own KV budget finds (and backs off to) sizes of its own: it must not
        # lower the size every job without one starts from.
        key.append({"kv_cache_memory_bytes": settings.kv_cache_memory_bytes})
    return json.dumps(key, separators=(",", ":"))


def _cache_file() -> Path:
    return cache_root() / "batch_sizes.json"


def cached_size(settings: EngineSettings, device: str) -> int | None:
    """A batch size an earlier job found for this set-up, if any."""
    try:
        data = json.loads(_cache_file().read_text())
        value = data.get(cache_key(settings, device))
        return int(value) if isinstance(value, int) and value > 0 else None
    except (OSError, ValueError, AttributeError):
        return None


def remember_size(settings: EngineSettings, device: str, size: int) -> None:
    """Record the chosen size so that the next job on this set-up starts at the answer."""
    _update_cache(cache_key(settings, device), lambda old: size)


def lower_size(settings: EngineSettings, device: str, size: int) -> None:
    """After an out-of-memory back-off: a cached size above `size` is lowered to it, so the next
    job on this set-up does not pay the same restarts again (no entry: nothing was measured)."""
    _update_cache(
        cache_key(settings, device), lambda old: min(old, size) if old is not None else None
    )


def _update_cache(key: str, change: Callable[[int | None], int | None]) -> None:
    """Read-modify-write the cache under a lock (jobs on one machine share it), atomically."""
    path = _cache_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.with_name(path.name + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                data: dict[str, Any] = json.loads(path.read_text())
                if not isinstance(data, dict):
                    data = {}
            except (OSError, ValueError):
                data = {}
            old = data.get(key)
            new = change(old if isinstance(old, int) and old > 0 else None)
            if new is None or new == old:
                return
            data[key] = new
            write_json_atomic(path, data)
    except (OSError, BatchrunError):
        pass  # a cache that cannot be written only costs a search next time
