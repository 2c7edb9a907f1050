"""What the scheduler says when a worker starts, and why one started before starts again."""

from __future__ import annotations

from collections.abc import Mapping

from batchrun.workers.process import Worker


def start_events(w: Worker, model: str | None = None) -> list[str]:
    """The lines the run's log gets as `w` starts (`model`: the one it runs, when a job runs
    several at once)."""
    where = f"pid {w.pid}, " if w.pid else ""
    if w.env.get("BATCHRUN_CPU_AFFINITY"):
        where += f"CPU cores {w.env['BATCHRUN_CPU_AFFINITY']}, "
    of = f" for model {model}" if model else ""
    lines = [
        f"{w.label} starting {w.settings.engine} engine{of} ({where}batch size {w.settings.window})"
    ]
    if w.env.get("BATCHRUN_CPU_SHARED_WITH"):
        lines.append(
            f"{w.label}: every CPU core already runs the model of another batchrun job "
            f"({w.env['BATCHRUN_CPU_SHARED_WITH']}); both run slowly while they share them. "
            "Give each job its own cores with OMP_NUM_THREADS (half each, say)"
        )
    return lines


def restart_reason(w: Worker, stopped_for: Mapping[int, str]) -> str:
    """Why `w`, started before, starts again: its death's kind, or why it was stopped
    (`stopped_for`, by index; a worker killed by the watchdog, hung, leaves no death of its own)."""
    death = w.death
    if death is None:
        return stopped_for.get(w.index, "hang")
    if death.oom:
        return "oom"
    return "start_failure" if death.during_start else "crash"
