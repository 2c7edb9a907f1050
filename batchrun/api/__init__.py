"""batchrun from Python: the CLI's jobs run in this process, over the same job directories.

`run` makes a job of request dicts (or a DataFrame or Table) and runs it; `submit` does the
same for an input file; `Job` is a job directory (its status, results, export, report,
resume and retry_failed). Options are the CLI's long options in snake_case. docs/python.md
says more.
"""

from __future__ import annotations

from batchrun.api.job import Job
from batchrun.api.options import EngineOptions
from batchrun.api.start import run, submit

__all__ = ["EngineOptions", "Job", "run", "submit"]
