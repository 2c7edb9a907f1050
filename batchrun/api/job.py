"""`batchrun.Job`: a job directory seen from Python, the same directory the CLI reads and
writes: made by `batchrun.run`, `batchrun.submit` or `batchrun submit`, continued by either."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from batchrun.api.inprocess import in_process
from batchrun.api.metrics import monitoring, started
from batchrun.api.options import given_options

if TYPE_CHECKING:
    from typing import Unpack

    import pandas as pd
    import pyarrow as pa

    from batchrun.api.options import EngineOptions
    from batchrun.export.job import ExportSummary


class Job:
    """A batchrun job directory: its status, results and files, and the runs that continue it.

    Made by `batchrun.run` or `batchrun.submit`, or `Job(job_dir)` for any job directory
    (one the CLI made too). Nothing is read until a method asks.
    """

    def __init__(self, job_dir: str | os.PathLike[str]) -> None:
        self.job_dir = Path(job_dir)

    def __repr__(self) -> str:
        return f"Job({str(self.job_dir)!r})"

    def __fspath__(self) -> str:
        return str(self.job_dir)

    def status(self) -> dict[str, Any]:
        """The job's counts, tokens, throughput and state: exactly `batchrun status --json`."""
        from batchrun.job.status import job_status
        from batchrun.job.strict_json import strict_dumps

        # Through JSON, as the CLI prints it: the same keys, lists, and nulls for NaN.
        parsed: dict[str, Any] = json.loads(strict_dumps(job_status(self.job_dir)))
        return parsed

    def resume(
        self,
        *,
        force: bool = False,
        input: str | os.PathLike[str] | None = None,
        ray: str | None = None,
        progress: bool = True,
        cache_dir: str | os.PathLike[str] | None = None,
        api_key: str | None = None,
        metrics_port: int | None = None,
        metrics_host: str | None = None,
        metrics_pushgateway: str | None = None,
        gpu_hour_cost: float | None = None,
        **options: Unpack[EngineOptions],
    ) -> Job:
        """Run what is not done yet (after Ctrl-C, a kill, a crash), as `batchrun resume` does;
        engine options given replace the job's own (and are saved into it); the metrics options
        are this run's, as `run`'s. Returns this job.

        Args:
            force: run even if the input file changed since submit (`--force`).
            input: the job's input file at a new place (`--input`).
        """
        metrics = (metrics_port, metrics_host, metrics_pushgateway, gpu_hour_cost)
        return self._continue(
            "resume", ray, progress, cache_dir, api_key, metrics, options, force, input
        )

    def retry_failed(
        self,
        *,
        ray: str | None = None,
        progress: bool = True,
        cache_dir: str | os.PathLike[str] | None = None,
        api_key: str | None = None,
        metrics_port: int | None = None,
        metrics_host: str | None = None,
        metrics_pushgateway: str | None = None,
        gpu_hour_cost: float | None = None,
        **options: Unpack[EngineOptions],
    ) -> Job:
        """One more pass over the requests whose last attempt failed, as `batchrun
        retry-failed` does (engine and metrics options as resume's). Returns this job."""
        metrics = (metrics_port, metrics_host, metrics_pushgateway, gpu_hour_cost)
        return self._continue("retry_failed", ray, progress, cache_dir, api_key, metrics, options)

    def _continue(
        self,
        function: str,
        ray: str | None,
        progress: bool,
        cache_dir: str | os.PathLike[str] | None,
        api_key: str | None,
        metrics: tuple[int | None, str | None, str | None, float | None],
        options: Mapping[str, Any],
        force: bool = False,
        input: str | os.PathLike[str] | None = None,
    ) -> Job:
        """resume and retry_failed (`function`): the options given checked as the CLI's, the
        run's metrics started, the job continued in this process."""
        from batchrun.run.jobs import continue_job

        with in_process(self.job_dir, api_key, retry=function == "retry_failed"):
            given = given_options(function, options, override=True)
            asked = monitoring(*metrics)
            with started(asked) as run_metrics:
                continue_job(
                    self.job_dir,
                    "resume" if function == "resume" else "retry",
                    progress=progress,
                    force=force,
                    ray=ray,
                    input_path=Path(input) if input is not None else None,
                    given=given,
                    metrics=run_metrics,
                    cache_dir=Path(cache_dir) if cache_dir is not None else None,
                )
        return self

    def results(self, *, partial: bool = False) -> pa.Table:
        """The results as a pyarrow Table: the rows and columns of `results.parquet` (one row per
        request and per invalid line). Refused while requests are pending, unless `partial`."""
        import pyarrow.parquet as pq

        from batchrun.export.job import export_job
        from batchrun.export.parquet import PARQUET_NAME

        with tempfile.TemporaryDirectory(prefix="batchrun-results-") as tmp:
            export_job(self.job_dir, Path(tmp), parquet=True, partial=partial)
            return pq.read_table(Path(tmp) / PARQUET_NAME)

    def to_pandas(self, *, partial: bool = False) -> pd.DataFrame:
        """The results as a pandas DataFrame, as `pandas.read_parquet` reads results.parquet."""
        return self.results(partial=partial).to_pandas()

    def export(
        self,
        to: str | None = None,
        parquet: bool = False,
        *,
        output_dir: str | os.PathLike[str] | None = None,
        partial: bool = False,
    ) -> ExportSummary:
        """Write output.jsonl + errors.jsonl (or results.parquet), as `batchrun export` does:
        into the job directory or `output_dir`, and uploaded under the URL prefix `to` (an
        s3:// or fsspec URL) when given. Returns what was written and its counts."""
        from batchrun.export.job import export_job

        prefix = None
        if to is not None:  # checked before anything is written
            from batchrun.storage.upload import check_destination

            prefix = check_destination(to)
        where = Path(output_dir) if output_dir is not None else self.job_dir
        summary = export_job(self.job_dir, where, parquet=parquet, partial=partial)
        if prefix is not None:
            from batchrun.storage.upload import upload_files

            upload_files(summary.paths, prefix)
        return summary

    def report(self, path: str | os.PathLike[str] | None = None) -> Path:
        """Write the job's self-contained HTML report page (default: JOB_DIR/report.html), as
        `batchrun report` does; returns where."""
        from batchrun.report.write import write_report

        written, _ = write_report(self.job_dir, Path(path) if path is not None else None)
        return written
