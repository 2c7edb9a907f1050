"""A command's core run in the caller's own process (a notebook's, a pipeline task's), as the
CLI's process runs it: a bad option raised with the CLI's line, and what the CLI's exit would
give back given back when the call ends.

Ctrl-C is the CLI's too: the core stops feeding, stops its workers, flushes the journal and
marks the job interrupted, then the KeyboardInterrupt goes on to the caller, and `Job.resume()`
continues. The CLI's own stop handlers (a second Ctrl-C ends the process at once) are not
installed: a notebook's kernel must outlive its job.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from batchrun.api.options import cli_lines
from batchrun.config import OptionError
from batchrun.engines.remote.urls import API_KEY_VARS
from batchrun.job.paths import JobPaths, command
from batchrun.stopping import ways_on
from batchrun.workers.cpu_claims import release_claim

# Where --api-key goes for the workers (the remote engine reads it there first).
_KEY_VAR = API_KEY_VARS[0]


@contextmanager
def in_process(job_dir: Path, api_key: str | None = None, *, retry: bool = False) -> Iterator[None]:
    """Run a core command on `job_dir` here: its OptionError as the CLI's line; Ctrl-C said as
    the CLI says it, with how to go on, and raised again; `api_key` (the remote
    engine's, `--api-key`) in this process's environment for the run's workers, as the CLI puts
    it there, and taken out again after (never into the job); the CPU cores its CPU engine
    claimed from other jobs on this machine given back once it ends (a CLI process gives them
    back as it exits; a kernel lives on)."""
    if _importing_the_callers_script():
        raise RuntimeError(
            "batchrun ran again inside one of its worker processes, which import the script "
            'that started it: call batchrun under `if __name__ == "__main__":` (as any code '
            "that starts processes must; a notebook needs nothing)"
        )
    saved = os.environ.get(_KEY_VAR)
    try:
        with cli_lines():
            if api_key is not None:
                if not isinstance(api_key, str):
                    raise OptionError("--api-key", f"must be a string, got {api_key!r}")
                if not api_key.strip():
                    raise OptionError("--api-key", "must not be empty")  # the CLI's words
                os.environ[_KEY_VAR] = api_key
            yield
    except KeyboardInterrupt:
        _say_how_to_go_on(job_dir, retry)
        raise
    finally:
        if saved is None:
            os.environ.pop(_KEY_VAR, None)
        else:
            os.environ[_KEY_VAR] = saved
        release_claim()


def _importing_the_callers_script() -> bool:
    """Whether this is a worker process importing the script that started it (multiprocessing's
    spawn runs a script's top level again in each child): a job started there would start its
    own workers, each of them again, and refuse its own job directory."""
    frame = sys._getframe()
    while frame is not None:
        if frame.f_code.co_name == "_fixup_main_from_path":  # multiprocessing/spawn.py
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


def _say_how_to_go_on(job_dir: Path, retry: bool) -> None:
    """After Ctrl-C, the CLI's line: the job is safe and how to continue it (from Python or the
    CLI; after a retry_failed that left failures, retry_failed), or, stopped before it was
    made, that nothing was."""
    if JobPaths(job_dir).manifest.exists():
        names = ways_on(str(job_dir), retry)
        job = f"batchrun.Job({str(job_dir)!r})"
        python = ", then ".join(f"{job}.{name.replace('-', '_')}()" for name in names)
        cli = ", then ".join(command(name, job_dir) for name in names)
        message = (
            "interrupted: the journal is flushed; nothing finished is lost. Continue with: "
            f"{python}, or {cli}"
        )
    else:
        message = "interrupted: stopped before the job was created; nothing was made"
    sys.stderr.write(f"\n{message}\n")
