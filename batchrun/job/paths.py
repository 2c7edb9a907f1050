"""Where a job keeps its files."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from batchrun.job.journal import JOURNAL_NAME

MANIFEST_NAME = "manifest.json"


LOCK_NAME = "lock"


# input-map-<generation>.jsonl: the input file as a forced resume found it (see InputMap).
INPUT_MAP_PREFIX = "input-map-"


@dataclass
class JobPaths:
    """Where a job keeps its files."""

    root: Path

    @property
    def logs(self) -> Path:
        """Where each engine worker's own output goes (logs/worker-N.log)."""
        return self.root / "logs"

    @property
    def manifest(self) -> Path:
        """The manifest file."""
        return self.root / MANIFEST_NAME

    @property
    def journal(self) -> Path:
        """The journal file."""
        return self.root / JOURNAL_NAME

    @property
    def lock(self) -> Path:
        """The lock file (holds the running process's id)."""
        return self.root / LOCK_NAME
