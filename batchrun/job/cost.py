"""The job's cost (cost.json): each run's USD from --gpu-hour-cost, for status, the summary and
`report`. Written by the run that spent it (metrics/run.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

COST_NAME = "cost.json"


def read_costs(job_dir: Path) -> list[dict[str, Any]]:
    """The runs' costs the job recorded (none without --gpu-hour-cost)."""
    try:
        data = json.loads((Path(job_dir) / COST_NAME).read_text(encoding="utf-8"))
        runs = data.get("runs", [])
        return [r for r in runs if isinstance(r, dict)] if isinstance(runs, list) else []
    except (OSError, ValueError, AttributeError):
        return []


def job_cost(job_dir: Path, tokens: int) -> dict[str, Any] | None:
    """The job's cost in USD and per million tokens (prompt + completion); None if unrecorded."""
    runs = read_costs(job_dir)
    if not runs:
        return None
    usd = sum(float(r.get("usd") or 0.0) for r in runs)
    return {
        "usd": round(usd, 6),
        "usd_per_million_tokens": round(usd / tokens * 1e6, 6) if tokens else None,
    }
