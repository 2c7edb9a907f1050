"""What a report shows, gathered in one pass over a job's journal with bounded memory.

The journal is read once, lightly (job/timing.py: the bodies are skipped). What is kept grows
with the job's duration (one count per second of results), its workers and its error codes (a
few example lines each), not with its requests: a report of a million requests costs what one of
a thousand does.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from batchrun.job.events import read_events
from batchrun.job.figures import JobFigures, job_figures
from batchrun.job.manifest import load_manifest
from batchrun.job.paths import JobPaths
from batchrun.job.status import cache_rate, run_state
from batchrun.job.timing import LightRecord, Timing, light_records

# Example lines kept per error code, and error codes kept (the rest are counted as "other").
EXAMPLES = 3
MAX_CODES = 40
# Points of a chart over time, at most: seconds are merged into wider bins past that.
MAX_POINTS = 400


@dataclass
class ReportData:
    """Everything the page shows, gathered from one job directory: its figures from the one fold
    of its journal (job/figures.py), and what only the page draws (results per second,
    examples of each error) from one light pass."""

    job_dir: Path
    job_id: str
    status: str
    model: str | None
    engine: str | None
    endpoint: str | None
    created_at: float
    figures: JobFigures
    timing: Timing
    # When the job's first run started: the charts' time axis starts there (never before).
    origin: float
    per_second: dict[int, list[int]] = field(default_factory=dict)  # second -> [ok, failed, tok]
    examples: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # Per worker: job/figures.py's rows, as `status` shows them.
    workers: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    prefix_cache: dict[str, Any] | None = None
    runs: list[dict[str, Any]] = field(default_factory=list)
    probes: list[dict[str, Any]] = field(default_factory=list)
    made_at: float = field(default_factory=time.time)

    @property
    def counts(self) -> dict[str, int]:
        """The request counts (job/figures.py)."""
        return self.figures.counts

    def add(self, rec: LightRecord) -> None:
        """Fold one journal record into what only the page draws."""
        if rec.kind == "invalid":
            self._example(rec)
            return
        if rec.kind != "result":
            return
        # Whole seconds since the origin: a result never lands before the chart's start.
        second = max(0, int(rec.time - self.origin))
        bin_ = self.per_second.get(second)
        if bin_ is None:
            bin_ = self.per_second[second] = [0, 0, 0]
        if rec.ok:
            bin_[0] += 1
        else:
            bin_[1] += 1
            self._example(rec)
        bin_[2] += rec.completion_tokens

    def _example(self, rec: LightRecord) -> None:
        code = str((rec.error or {}).get("code") or "unknown")
        kept = self.examples.get(code)
        if kept is None:
            if len(self.examples) >= MAX_CODES:
                return
            kept = self.examples[code] = []
        if len(kept) < EXAMPLES:
            kept.append(
                {
                    "line": rec.line,
                    "custom_id": rec.custom_id,
                    "message": str((rec.error or {}).get("message") or "")[:500],
                    "attempt": rec.attempt if rec.kind == "result" else None,
                }
            )


def gather(job_dir: Path) -> ReportData:
    """Read a job directory (finished, running or stopped) into what its report shows; a
    directory that is not a job is a BatchrunError (one line)."""
    paths = JobPaths(job_dir)
    manifest = load_manifest(paths)
    status, live = run_state(paths, manifest)
    figures, summary = job_figures(paths, manifest, live, save=False)
    starts = [r.started_at for r in manifest.runs]
    data = ReportData(
        job_dir=job_dir,
        job_id=manifest.job_id,
        status=status,
        model=manifest.model,
        engine=manifest.engine.get("engine"),
        endpoint=manifest.endpoint,
        created_at=manifest.created_at,
        figures=figures,
        timing=summary.timing_of(starts),
        origin=min(starts) if starts else manifest.created_at,
        prefix_cache=cache_rate(
            manifest.prefix_cache.get("queries", 0), manifest.prefix_cache.get("hits", 0)
        ),
        runs=[
            {
                "mode": r.mode,
                "started_at": r.started_at,
                "ended_at": r.ended_at,
                "status": r.status,
                "wall_s": round(wall, 3),
            }
            for r, wall in zip(manifest.runs, figures.run_walls, strict=True)
        ],
        probes=list(manifest.probes),
        workers=figures.workers,
    )
    for rec in light_records(paths.journal):
        data.add(rec)
    data.events = list(read_events(job_dir))
    return data
