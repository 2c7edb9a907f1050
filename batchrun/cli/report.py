"""`batchrun report`: a job's HTML report page (batchrun/report)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from batchrun.cli.exits import fail, plain
from batchrun.cli.options import JobDir
from batchrun.errors import BatchrunError


def report(
    job_dir: JobDir,
    output: Annotated[
        Path | None,
        typer.Option(
            "--output",
            "-o",
            help="Where to write the page. \\[default: JOB_DIR/report.html]",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Write one self-contained HTML page about a job (finished, running or stopped): counts,
    throughput over time, latency and queue wait, errors by code with examples, batch size,
    restarts and back-offs, per-worker throughput, cache and duplicate savings, cost."""
    from batchrun.report.write import write_report

    try:
        path, size = write_report(job_dir, output)
    except BatchrunError as e:
        fail(str(e), e.exit_code)
    plain(f"report: {path} ({size / 1024:,.0f} KiB)")
