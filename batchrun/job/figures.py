"""Every figure a job shows, derived in one place from the one fold of its journal.

`status` (text and `--json`), the end-of-run summary, `report` and serve's request counts read
a `JobFigures`; none of them counts on its own. The fold is the job's summary (job/summary.py:
the journal's records folded by `Summary.fold` and `Timing.add`, kept beside the journal so
that reading it costs O(1)); the run times come from the manifest and the run clock
(job/run_clock.py). Each figure is defined once, in docs/metrics.md (the glossary):

- requests: `valid` (lines that run), `invalid` (lines that failed validation), `total` (both);
- `succeeded`, `failed`: valid requests whose last attempt succeeded, failed; `pending`: valid
  requests with no finished attempt;
- `attempts`: every result journaled for the job's requests, a duplicate's copy and an answer
  from the answer cache included; `engine_attempts`: those the engine ran (attempts less the
  copies less `cache_hits`); `deduplicated`: requests first answered with a copy of an
  identical one's outcome, each once however many of its attempts were copies;
- error rate: failed attempts plus invalid lines, over attempts plus invalid lines;
- `wall_s` (run time): the runs' wall time, killed runs included, never a gap between runs;
  cost: that time priced (job/cost.py);
- throughput: the engine's attempts and generated tokens over the run time;
- per worker (`workers`): its engine attempts, their generated tokens, and both over its own
  active time (the time at least one of its attempts was in the engine: job/tally.py); per
  model the same over the model's active time (job/model_counts.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from batchrun.job.cost import job_cost
from batchrun.job.manifest import Manifest
from batchrun.job.paths import JobPaths
from batchrun.job.run_clock import run_walls
from batchrun.job.summary import current_summary
from batchrun.job.summary_counts import Summary
from batchrun.job.tally import WorkerFigures


@dataclass(frozen=True)
class JobFigures:
    """A job's figures as of one reading of its fold (see the module docstring)."""

    valid: int
    invalid: int
    succeeded: int
    failed: int
    pending: int
    attempts: int
    engine_attempts: int
    deduplicated: int
    cache_hits: int
    prompt_tokens: int
    completion_tokens: int
    engine_completion_tokens: int
    # The runs' wall times, in order (a live run's until now, a killed run's until last seen).
    run_walls: list[float]
    cost: dict[str, Any] | None
    first_time: float | None
    last_time: float | None
    # Latency, queue wait and errors: `Timing.summary()` of the same records.
    timing: dict[str, Any] = field(default_factory=dict)
    # Per worker: `worker_rows` of the same fold.
    workers: list[dict[str, Any]] = field(default_factory=list)

    @property
    def total(self) -> int:
        """Valid requests and invalid lines."""
        return self.valid + self.invalid

    @property
    def wall_s(self) -> float:
        """Every run's wall time, summed."""
        return sum(self.run_walls)

    @property
    def counts(self) -> dict[str, int]:
        """The request counts, as status, the report's data and the manifest name them."""
        return {
            "total": self.total,
            "valid": self.valid,
            "succeeded": self.succeeded,
            "failed": self.failed,
            "invalid": self.invalid,
            "pending": self.pending,
        }

    def throughput(self) -> dict[str, Any]:
        """The engine's requests/s and generated tokens/s over the run time (the runs' wall
        time: a pause between runs is never in it), and that time."""
        span = self.wall_s
        return {
            "requests_per_s": round(self.engine_attempts / span, 2) if span > 0 else None,
            "completion_tokens_per_s": round(self.engine_completion_tokens / span, 2)
            if span > 0
            else None,
            "over": "runs",
            "seconds": round(span, 3),
            "counts": "engine",  # neither duplicates' copies nor cache hits
        }


def worker_rows(manifest: Manifest, summary: Summary) -> list[dict[str, Any]]:
    """Each worker's figures (the glossary's): where it ran (the latest run's), its engine
    attempts and generated tokens, and their rates over its own active time. What `status`,
    `status --json`, the report page and /metrics show of workers."""
    info = manifest.worker_info or {}
    per_worker = summary.per_worker
    rows = []
    for key in sorted(set(info) | set(per_worker), key=lambda k: int(k)):
        stats = per_worker.get(key) or WorkerFigures()
        where = info.get(key, {})
        rows.append(
            {
                "worker": int(key),
                "label": where.get("label", f"worker {key}"),
                "kind": where.get("kind"),
                "node": where.get("node"),
                "gpus": where.get("gpus"),
                "requests": stats.attempts,
                "completion_tokens": stats.completion_tokens,
                "active_s": round(stats.active.seconds, 3),
                "requests_per_s": stats.requests_per_s(),
                "tokens_per_s": stats.tokens_per_s(),
                "kv_cache_tokens": where.get("kv_cache_tokens"),
            }
        )
    return rows


def figures_of(
    paths: JobPaths,
    manifest: Manifest,
    summary: Summary,
    live_pid: int | None = None,
    now: float | None = None,
) -> JobFigures:
    """The figures of `summary` (the job's fold); `live_pid`: the process running the job."""
    walls = run_walls(paths, manifest, live_pid, time.time() if now is None else now)
    tokens = summary.prompt_tokens + summary.completion_tokens
    timing = summary.timing_of([r.started_at for r in manifest.runs]).summary()
    return JobFigures(
        valid=manifest.requests,
        invalid=summary.invalid,
        succeeded=summary.succeeded,
        failed=summary.failed,
        pending=summary.pending(manifest.requests),
        attempts=summary.attempts,
        engine_attempts=summary.engine_attempts,
        deduplicated=summary.deduplicated,
        cache_hits=summary.cache_hits,
        prompt_tokens=summary.prompt_tokens,
        completion_tokens=summary.completion_tokens,
        engine_completion_tokens=summary.engine_completion_tokens,
        run_walls=walls,
        cost=job_cost(paths.root, manifest.runs, walls, tokens),
        first_time=summary.first_time,
        last_time=summary.last_time,
        timing=timing,
        workers=worker_rows(manifest, summary),
    )


def job_figures(
    paths: JobPaths, manifest: Manifest, live_pid: int | None = None, *, save: bool = True
) -> tuple[JobFigures, Summary]:
    """The job's figures now (its fold read, checked and brought up to the journal's end), and
    the fold they came from (per worker and per model figures are read from it)."""
    summary = current_summary(paths, manifest, save=save)
    return figures_of(paths, manifest, summary, live_pid), summary
