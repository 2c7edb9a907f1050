"""A job's run and its metrics: the scheduler's state behind the gauges while it runs."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from batchrun.job.figures import job_figures
from batchrun.job.manifest import Manifest
from batchrun.job.paths import JobPaths
from batchrun.metrics.recorder import RunMetrics, attach, detach


def watch_run(
    metrics: RunMetrics,
    scheduler: Any,
    reporter: Any,
    envs: Sequence[Mapping[str, Any]],
    max_attempts: int,
    state: Any,
    mode: str,
    job: tuple[JobPaths, Manifest] | None = None,
) -> None:
    """Feed `metrics` from this run's scheduler (run/passes.py calls it when the run starts);
    `job`: the job's directory and manifest, whose id groups its Pushgateway pushes and whose
    figures over every run (job/figures.py) are exported beside the run's."""
    initial = state.done if mode != "retry" else 0

    def queue_depth() -> int:
        # What the progress bar counts still to do (retry passes add to its total), less what
        # is in flight: requests not dispatched yet.
        total = int(reporter.bar.total or 0)
        in_flight = sum(len(w.inflight) for w in scheduler.workers)
        return max(0, total - initial - int(reporter.done) - in_flight)

    # The invalid lines are counted by the run that found them: the submit that validated.
    invalid = int(state.invalid) if mode in ("submit", "tune") else 0
    attach(
        metrics,
        scheduler,
        queue_depth=queue_depth,
        envs=envs,
        max_attempts=max_attempts,
        invalid=invalid,
        job_id=job[1].job_id if job is not None else None,
    )
    if job is not None:
        paths, manifest = job
        pid = os.getpid()
        # Read when scraped or pushed: O(1) in the journal (its summary plus the tail).
        metrics.job_figures = lambda: job_figures(paths, manifest, pid, save=False)[0]


def end_run(metrics: RunMetrics, scheduler: Any) -> None:
    """The run ended: freeze its gauges. (Its cost is the manifest's: job/cost.py.)"""
    detach(metrics, scheduler)
