"""A job's status, derived from its manifest and its journal (the journal is the truth)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from batchrun.job.figures import job_figures
from batchrun.job.lasting import lasting_failures
from batchrun.job.lock import lock_holder
from batchrun.job.manifest import JobValidating, Manifest, find_input, load_manifest
from batchrun.job.model_counts import model_counts
from batchrun.job.paths import JobPaths


def job_status(job_dir: Path) -> dict[str, Any]:
    """Everything `batchrun status` shows, as one JSON-ready object.

    O(1) in the journal's length: the job's summary plus the journal past it (job/summary.py);
    every figure from job/figures.py.
    """
    paths = JobPaths(job_dir)
    try:
        manifest = load_manifest(paths)
    except JobValidating as e:
        # A submit still validating its input: nothing to count yet, and nothing wrong.
        return {"job_id": None, "job_dir": str(job_dir), "status": "validating", "pid": e.pid}
    # Where resume would find the input: a job moved together with its input finds it there.
    found = find_input(paths, manifest)
    status, live = run_state(paths, manifest)
    # Of the input as it is now: after a forced resume, only the requests still in the file.
    figures, state = job_figures(paths, manifest, live)
    return {
        "job_id": manifest.job_id,
        "job_dir": str(job_dir),
        "status": status,
        "pid": live,
        "input": str(found) if found is not None else manifest.input_path,
        "endpoint": manifest.endpoint,
        "model": manifest.model,
        "engine": manifest.engine.get("engine"),
        "batch_size": manifest.batch_size,
        "batch_size_source": manifest.batch_size_source,
        "requests": figures.counts,
        "attempts": figures.attempts,
        "engine_attempts": figures.engine_attempts,
        "tokens": {"prompt": figures.prompt_tokens, "completion": figures.completion_tokens},
        "throughput": figures.throughput(),
        "runs": len(manifest.runs),
        "wall_s": round(figures.wall_s, 3),
        "probes": manifest.probes,
        "workers": figures.workers,
        "order": manifest.order,
        "prefix_cache": cache_rate(
            manifest.prefix_cache.get("queries", 0), manifest.prefix_cache.get("hits", 0)
        ),
        # The KV cache the engine reported at start (tokens a worker; the smallest of them):
        # the budget the dispatch plan keeps prefixes within (run/admission.py). None: not known.
        "kv_cache_tokens": kv_cache_tokens(manifest),
        "deduplicated": figures.deduplicated,
        "cache_hits": figures.cache_hits,
        # latency_s and queue_s ({p50, p99}), errors (rate and by code): from the summary.
        **figures.timing,
        # Of the failed requests, those a retry cannot fix, by error code (job/lasting.py).
        "retry_cannot_fix": lasting_failures(figures.timing.get("errors"), figures.failed).by_code,
        "cost": figures.cost,
        # Per base model and adapter (job/model_counts.py).
        "models": model_counts(manifest, state, figures.throughput()["completion_tokens_per_s"]),
    }


def run_state(paths: JobPaths, manifest: Manifest) -> tuple[str, int | None]:
    """The job's status as a reader sees it, and the pid of the process running it (None: none):
    `running` while a process holds the lock, `interrupted` where the manifest says running but
    no process holds it (a kill), else the manifest's."""
    holder = lock_holder(paths)
    status = manifest.status
    if holder is not None:
        status = "running"
    elif status == "running":
        status = "interrupted"
    return status, holder if holder is not None and holder > 0 else None


def cache_rate(queries: int, hits: int) -> dict[str, Any] | None:
    """vLLM's prefix-cache counters and their hit rate; None when nothing was counted."""
    if not queries:
        return None
    return {"queries": queries, "hits": hits, "hit_rate": round(hits / queries, 4)}


def kv_cache_tokens(manifest: Manifest) -> int | None:
    """The smallest KV cache, in tokens, that a worker of the latest run reported; None if none."""
    sizes = [
        int(w["kv_cache_tokens"])
        for w in (manifest.worker_info or {}).values()
        if isinstance(w, dict) and isinstance(w.get("kv_cache_tokens"), int)
    ]
    return min(sizes) if sizes else None
