"""A command's core run in the caller's own process (a notebook's, a pipeline task's), as the
CLI's process runs it: a bad option raised with the CLI's line, and what the CLI's exit would
give back given back when the call ends.

Ctrl-C is the CLI's too: the core stops feeding, stops its workers, flushes the journal and
marks the job interrupted, then the KeyboardInterrupt goes on to the caller, and `Job.resume()`
continues. The CLI's own stop handlers (a second Ctrl-C ends the process at once) are not
installed: a notebook's kernel must outlive its job.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from batchrun.api.options import cli_lines
from batchrun.workers.cpu_claims import release_claim


@contextmanager
def in_process() -> Iterator[None]:
    """Run a core command here: its OptionError as the CLI's line; the CPU cores its CPU engine
    claimed from other jobs on this machine given back once it ends (a CLI process gives them
    back as it exits; a kernel lives on)."""
    try:
        with cli_lines():
            yield
    finally:
        release_claim()
