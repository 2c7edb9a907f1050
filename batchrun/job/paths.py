"""Where a job keeps its files, and the command line that names a job's directory."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from batchrun.job.journal import JOURNAL_NAME
from batchrun.job.shards import shards_dir
from batchrun.job.vectors import vectors_path

MANIFEST_NAME = "manifest.json"


LOCK_NAME = "lock"
# What export and report write into the job directory unless told another place.
OUTPUT_NAME = "output.jsonl"
ERRORS_NAME = "errors.jsonl"
PARQUET_NAME = "results.parquet"
REPORT_NAME = "report.html"


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
    def vectors(self) -> Path:
        """The journal's side file of vectors (job/vectors.py)."""
        return vectors_path(self.journal)

    @property
    def shards(self) -> Path:
        """Where the workers write their results' bodies (job/shards.py)."""
        return shards_dir(self.root)

    @property
    def lock(self) -> Path:
        """The lock file (holds the running process's id)."""
        return self.root / LOCK_NAME


def command(name: str, job_dir: Path | str, *extra: str) -> str:
    """`batchrun NAME --job-dir DIR ...`, shell-quoted: a directory with spaces pastes back whole."""
    return shlex.join(["batchrun", name, "--job-dir", str(job_dir), *extra])


def default_job_dir(input_file: Path | str) -> Path:
    """jobs/<input name> (of a URL, its last part), where submit makes a job given no --job-dir:
    a name made only of dots ("..", ".") must not climb out of jobs/."""
    stem = Path(input_file).stem.strip()
    if not stem or set(stem) == {"."}:
        stem = "job"
    return Path("jobs") / stem
