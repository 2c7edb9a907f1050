"""A job's run and its metrics: the scheduler's state behind the gauges while it runs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from batchrun.metrics.recorder import RunMetrics, attach, detach


def watch_run(
    metrics: RunMetrics,
    scheduler: Any,
    reporter: Any,
    envs: Sequence[Mapping[str, Any]],
    max_attempts: int,
    state: Any,
    mode: str,
    job_id: str | None = None,
) -> None:
    """Feed `metrics` from this run's scheduler (run/passes.py calls it when the run starts);
    `job_id`: the job's, for the Pushgateway's grouping key."""
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
        job_id=job_id,
    )


def end_run(metrics: RunMetrics, scheduler: Any) -> None:
    """The run ended: freeze its gauges. (Its cost is the manifest's: job/cost.py.)"""
    detach(metrics, scheduler)
