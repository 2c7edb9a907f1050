"""A run's clock: how long each run of a job lasted, kept as the run goes so that a kill keeps it.

A run that ends normally writes its `ended_at` and `wall_s` into the manifest. One killed with
`kill -9` (or by a power cut, an OOM killer) writes nothing at its end, so the run that is
running keeps `run_clock.json` beside the manifest: its start, its pid and when it was last seen,
rewritten every `INTERVAL_S` seconds by a background thread. A killed run's time is then its
last sighting less its start: all but the last few seconds. The next run of the job settles it
into the manifest (`settle_runs`); until then `run_walls` reads it from the clock.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from batchrun.job.manifest import Manifest, Run
from batchrun.job.paths import JobPaths

CLOCK_NAME = "run_clock.json"
# How often a running job says it is alive: what a kill may cost of its recorded time.
INTERVAL_S = 2.0
# The status a run killed without a word is settled with.
KILLED = "killed"


def clock_path(paths: JobPaths) -> Path:
    """Where the running run keeps its clock."""
    return paths.root / CLOCK_NAME


def _write(path: Path, run: Run, seen_at: float) -> None:
    """Replace the clock (temp file renamed over it; not fsync'd: a power cut loses seconds)."""
    payload = json.dumps({"started_at": run.started_at, "pid": run.pid, "seen_at": seen_at})
    tmp = path.with_name(f".{CLOCK_NAME}.{os.getpid()}.tmp")
    try:
        tmp.write_text(payload, encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()


def see(paths: JobPaths, run: Run) -> None:
    """Write `run`'s clock now: it is alive (for a process that keeps many runs' clocks on one
    thread, as `batchrun serve` does, instead of a RunClock each)."""
    _write(clock_path(paths), run, time.time())


def last_seen(paths: JobPaths, run: Run) -> float | None:
    """When `run` was last seen alive, by the clock; None when the clock is another run's."""
    try:
        data: Any = json.loads(clock_path(paths).read_text(encoding="utf-8"))
        if data["started_at"] == run.started_at and data["pid"] == run.pid:
            return float(data["seen_at"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


class RunClock:
    """Keeps a run's clock while it runs (a daemon thread); `stop` writes the last sighting."""

    def __init__(self, paths: JobPaths, run: Run, interval_s: float = INTERVAL_S) -> None:
        self.path = clock_path(paths)
        self.run = run
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="batchrun-run-clock", daemon=True)

    def start(self) -> RunClock:
        """Write the clock now and keep it from now on."""
        _write(self.path, self.run, time.time())
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            _write(self.path, self.run, time.time())

    def stop(self) -> None:
        """The run ends: its last sighting is now."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        _write(self.path, self.run, time.time())


def run_walls(paths: JobPaths, manifest: Manifest, live_pid: int | None, now: float) -> list[float]:
    """Each run's wall time in seconds: as it recorded at its end; a live run's (the process
    `live_pid` holds the job) until `now`; a killed run's until its clock last saw it (0 when
    no clock saw it: a run of a batchrun before the clock)."""
    walls = []
    for run in manifest.runs:
        if run.wall_s is not None:
            walls.append(float(run.wall_s))
        elif live_pid is not None and run.pid == live_pid and run is manifest.runs[-1]:
            walls.append(max(0.0, now - run.started_at))
        else:
            seen = last_seen(paths, run)
            walls.append(max(0.0, seen - run.started_at) if seen is not None else 0.0)
    return walls


def settle_runs(paths: JobPaths, manifest: Manifest) -> None:
    """Close, in the manifest, the runs that were killed before they could (the caller holds the
    job's lock, so none of them is running): each ends when its clock last saw it."""
    for run in manifest.runs:
        if run.ended_at is not None:
            continue
        seen = last_seen(paths, run)
        if seen is not None:
            run.ended_at = seen
            run.wall_s = round(max(0.0, seen - run.started_at), 3)
        run.status = run.status or KILLED
