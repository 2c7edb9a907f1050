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

from batchrun.job.cost import job_cost
from batchrun.job.events import read_events
from batchrun.job.lock import lock_holder
from batchrun.job.manifest import load_manifest
from batchrun.job.paths import JobPaths
from batchrun.job.status import cache_rate
from batchrun.job.timing import LightRecord, Timing, light_records

# Example lines kept per error code, and error codes kept (the rest are counted as "other").
EXAMPLES = 3
MAX_CODES = 40
# Points of a chart over time, at most: seconds are merged into wider bins past that.
MAX_POINTS = 400


@dataclass
class WorkerFacts:
    """One worker's results: attempts, generated tokens, first and last result times."""

    attempts: int = 0
    completion_tokens: int = 0
    first: float = 0.0
    last: float = 0.0


@dataclass
class ReportData:
    """Everything the page shows, gathered from one job directory."""

    job_dir: Path
    job_id: str
    status: str
    model: str | None
    engine: str | None
    endpoint: str | None
    created_at: float
    counts: dict[str, int]
    tokens: dict[str, int]
    timing: Timing
    per_second: dict[int, list[int]] = field(default_factory=dict)  # second -> [ok, failed]
    examples: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    workers: dict[int, WorkerFacts] = field(default_factory=dict)
    deduplicated: int = 0
    events: list[dict[str, Any]] = field(default_factory=list)
    prefix_cache: dict[str, Any] | None = None
    cost: dict[str, Any] | None = None
    runs: list[dict[str, Any]] = field(default_factory=list)
    probes: list[dict[str, Any]] = field(default_factory=list)
    made_at: float = field(default_factory=time.time)

    def add(self, rec: LightRecord) -> None:
        """Fold in one journal record."""
        self.timing.add(rec)
        if rec.kind == "invalid":
            self._example(rec)
            return
        if rec.kind != "result":
            return
        if rec.copy_of is not None:
            self.deduplicated += 1
        second = int(rec.time)
        bin_ = self.per_second.get(second)
        if bin_ is None:
            bin_ = self.per_second[second] = [0, 0, 0]
        if rec.ok:
            bin_[0] += 1
        else:
            bin_[1] += 1
            self._example(rec)
        bin_[2] += rec.completion_tokens
        if rec.worker is not None and rec.copy_of is None:
            w = self.workers.get(rec.worker)
            if w is None:
                w = self.workers[rec.worker] = WorkerFacts(first=rec.time)
            w.attempts += 1
            w.completion_tokens += rec.completion_tokens
            w.first = min(w.first, rec.time)
            w.last = max(w.last, rec.time)

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
    status = manifest.status
    if lock_holder(paths) is not None:
        status = "running"
    elif status == "running":
        status = "interrupted"
    data = ReportData(
        job_dir=job_dir,
        job_id=manifest.job_id,
        status=status,
        model=manifest.model,
        engine=manifest.engine.get("engine"),
        endpoint=manifest.endpoint,
        created_at=manifest.created_at,
        counts=dict(manifest.counts),
        tokens=dict(manifest.tokens or {}),
        timing=Timing([r.started_at for r in manifest.runs]),
        prefix_cache=cache_rate(
            manifest.prefix_cache.get("queries", 0), manifest.prefix_cache.get("hits", 0)
        ),
        runs=[
            {
                "mode": r.mode,
                "started_at": r.started_at,
                "ended_at": r.ended_at,
                "status": r.status,
                "wall_s": r.wall_s,
            }
            for r in manifest.runs
        ],
        probes=list(manifest.probes),
    )
    prompt = completion = 0
    for rec in light_records(paths.journal):
        data.add(rec)
        if rec.kind == "result":
            prompt += rec.prompt_tokens
            completion += rec.completion_tokens
    if not data.tokens:  # a job still running its first run: the journal's sums
        data.tokens = {"prompt": prompt, "completion": completion}
    if not data.counts:
        t = data.timing
        data.counts = {
            "total": manifest.requests + manifest.invalid,
            "succeeded": t.attempts - t.failed,
            "failed": t.failed,
            "invalid": t.invalid,
        }
    data.counts.setdefault("valid", manifest.requests)
    data.events = list(read_events(job_dir))
    data.cost = job_cost(job_dir, data.tokens.get("prompt", 0) + data.tokens.get("completion", 0))
    return data
