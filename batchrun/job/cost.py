"""A job's cost: each run's wall time (job/run_clock.py) times its --gpu-hour-cost and the GPUs it
held, summed over the job's runs, killed ones included. The one place cost is derived.

A run given no --gpu-hour-cost is priced at the rate the job's latest run was given (the same
machine, as a rule: a resume of a job submitted without the flag). Jobs of a batchrun before
runs kept their rate have their runs' USD in cost.json, written at each run's end; it is read
when no run of the manifest has a rate.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from batchrun.job.manifest import Run

COST_NAME = "cost.json"


def gpu_units(envs: Sequence[Mapping[str, Any]]) -> int:
    """GPUs the workers hold (their CUDA_VISIBLE_DEVICES), or 1: a CPU machine."""
    n = 0
    for env in envs:
        given = str(env.get("CUDA_VISIBLE_DEVICES") or "").strip()
        if given:
            n += len([d for d in given.split(",") if d.strip()])
    return max(1, n)


def _legacy_usd(job_dir: Path) -> float | None:
    """The USD of the runs an older batchrun recorded in cost.json; None: none recorded."""
    try:
        data = json.loads((Path(job_dir) / COST_NAME).read_text(encoding="utf-8"))
        runs = data.get("runs", [])
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(runs, list) or not runs:
        return None
    return sum(float(r.get("usd") or 0.0) for r in runs if isinstance(r, dict))


def runs_usd(runs: Sequence[Run], walls: Sequence[float]) -> float | None:
    """The runs' USD (`walls`: each run's seconds); None when no run was given a rate."""
    rates = [r.usd_per_hour for r in runs if r.usd_per_hour is not None]
    if not rates:
        return None
    latest = rates[-1]
    usd = 0.0
    for run, wall in zip(runs, walls, strict=True):
        rate = run.usd_per_hour if run.usd_per_hour is not None else latest
        usd += rate * (run.units or 1) * wall / 3600.0
    return usd


def job_cost(
    job_dir: Path, runs: Sequence[Run], walls: Sequence[float], tokens: int
) -> dict[str, Any] | None:
    """The job's cost in USD and per million tokens (prompt + completion); None if unrecorded."""
    usd = runs_usd(runs, walls)
    if usd is None:
        usd = _legacy_usd(job_dir)
    if usd is None:
        return None
    return {
        "usd": round(usd, 6),
        "usd_per_million_tokens": round(usd / tokens * 1e6, 6) if tokens else None,
    }
