"""The run clocks of the batches a server runs: one thread keeps every running batch's
`run_clock.json` (job/run_clock.py), so that a server killed with `kill -9` leaves each batch its
run's time (all but the last few seconds); the next server settles those runs when it takes the
batches up again (serve/jobview.py)."""

from __future__ import annotations

import threading
from collections.abc import Callable

from batchrun.job.manifest import Run
from batchrun.job.paths import JobPaths
from batchrun.job.run_clock import INTERVAL_S, see


class Clocks:
    """Every `INTERVAL_S`, writes the clock of each run that `running()` names (a daemon thread)."""

    def __init__(
        self,
        running: Callable[[], list[tuple[JobPaths, Run]]],
        interval_s: float = INTERVAL_S,
    ) -> None:
        self.running = running
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="batchrun-clocks", daemon=True)

    def start(self) -> None:
        """Keep the clocks from now on."""
        self._thread.start()

    def stop(self) -> None:
        """Stop keeping them (the runs are closed in their manifests, or the server is killed)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            for paths, run in self.running():
                see(paths, run)
