"""The commands that read a job: status and export."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from batchrun.cli.exits import fail, out, plain
from batchrun.cli.options import JobDir
from batchrun.errors import BatchrunError


def export(
    job_dir: JobDir,
    parquet: Annotated[
        bool,
        typer.Option(
            "--parquet", help="Write results.parquet instead of output.jsonl + errors.jsonl."
        ),
    ] = False,
    output_dir: Annotated[
        Path | None,
        typer.Option(
            "--output-dir",
            "-o",
            envvar="BATCHRUN_OUTPUT_DIR",
            help="Where to write. [default: the job directory]",
            show_default=False,
        ),
    ] = None,
    partial: Annotated[
        bool,
        typer.Option(
            "--partial",
            help="Export what is finished even though requests are still pending (they are not in the output).",
        ),
    ] = False,
    to: Annotated[
        str | None,
        typer.Option(
            "--to",
            metavar="URL",
            help="Also upload the files written to this URL prefix (s3://BUCKET/PREFIX/, or any fsspec URL whose package is installed), overwriting what is there. Credentials and endpoint as the AWS tools take them (AWS_PROFILE, AWS_ENDPOINT_URL, ...).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Write the results: output.jsonl + errors.jsonl (OpenAI batch output format), or results.parquet."""
    from batchrun.export.job import export_job

    try:
        prefix = _destination(to) if to is not None else None  # before anything is written
        summary = export_job(job_dir, output_dir or job_dir, parquet=parquet, partial=partial)
    except BatchrunError as e:
        fail(str(e), e.exit_code)
    out.print(summary.describe(), highlight=False, soft_wrap=True)
    for path in summary.paths:
        out.print(f"wrote {path}", highlight=False, soft_wrap=True)
    if prefix is not None:
        from batchrun.storage.upload import upload_files

        try:
            for url in upload_files(summary.paths, prefix):
                out.print(f"uploaded {url}", highlight=False, soft_wrap=True)
        except BatchrunError as e:
            fail(str(e), e.exit_code)


def _destination(url: str) -> str:
    """export --to: the URL prefix the files go under, checked before any is written."""
    from batchrun.storage.upload import check_destination

    return check_destination(url)


def status(
    job_dir: JobDir,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Show a job's request counts, tokens, throughput and state."""
    from batchrun.job.status import job_status

    try:
        s = job_status(job_dir)
    except BatchrunError as e:
        fail(str(e), e.exit_code)
    if as_json:
        # Strict JSON always: a value that is no number (a probe's rate of an old job, say)
        # is null, never the NaN or Infinity strict parsers refuse.
        from batchrun.job.strict_json import strict_dumps

        sys.stdout.write(strict_dumps(s) + "\n")
        return
    if s["status"] == "validating":  # no manifest yet: no table to show
        plain(
            f"{job_dir}: being submitted, validating its input (pid {s['pid']}); status shows "
            "its counts once it starts running"
        )
        return
    from batchrun.console.render import print_probes, print_status, print_workers

    print_status(out, s)
    if len(s["workers"]) > 1 or any(w.get("kind") == "ray" for w in s["workers"]):
        print_workers(out, s["workers"])
    if s["probes"]:
        print_probes(out, s["probes"], s["batch_size"])
