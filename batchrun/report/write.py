"""Write a job's report page (the core of `batchrun report`)."""

from __future__ import annotations

from pathlib import Path

from batchrun.errors import BatchrunError
from batchrun.job.files import atomic_write
from batchrun.job.paths import REPORT_NAME as REPORT_NAME
from batchrun.report.data import gather
from batchrun.report.page import render


def write_report(job_dir: Path, output: Path | None = None) -> tuple[Path, int]:
    """Write the report of the job in `job_dir` to `output` (default: JOB/report.html);
    returns where, and its size in bytes."""
    data = gather(job_dir)
    page = render(data).encode("utf-8")
    target = output if output is not None else job_dir / REPORT_NAME
    if target.is_dir():
        raise BatchrunError(f"--output {target} is a directory; name a file")
    if not target.parent.is_dir():
        raise BatchrunError(f"--output {target}: the directory {target.parent} does not exist")
    atomic_write(target, lambda f: f.write(page))
    return target, len(page)
