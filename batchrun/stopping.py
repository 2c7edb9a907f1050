"""Ctrl-C and SIGTERM: the first one stops gracefully, a second one stops at once.

The first SIGINT or SIGTERM raises KeyboardInterrupt (`Terminated` for SIGTERM) in the main
thread: the runner stops feeding, stops its workers, flushes and fsyncs the journal and records
the stop in the manifest, and the CLI exits 130 or 143. A second one while that is under way (or
while Python shuts down) kills the workers and exits at once with the same code. That is safe:
every journal line is handed to the kernel in one unbuffered write as its result arrives, and the
manifest is replaced atomically, so neither can be left torn by the exit.

The handler's raise can be lost: a signal that lands while Python runs a finalizer or a weakref
callback (an import's module lock has one) has its exception printed as "Exception ignored" and
dropped. The run's wait loop calls `deliver_pending`, which raises it again.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import threading
from pathlib import Path
from types import FrameType

EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled like Ctrl-C so that the journal is flushed on the way out."""


_first: int | None = None  # the signal that started the graceful stop
_job_dir: str | None = None
_again: str | None = None
_resume: str | None = None  # the command that continues, when it is not `batchrun resume`
_retry = False  # the command run is retry-failed: what it leaves failed, only it runs again


def set_job(job_dir: object, again: str | None = None, *, retry: bool = False) -> None:
    """Name the job being run, for the message of an immediate stop; `again` is the command
    that starts over while the job does not exist yet (a submit still validating); `retry`:
    the command is retry-failed."""
    global _job_dir, _again, _retry
    _job_dir, _again, _retry = str(job_dir), again, retry


def set_resume(command: str) -> None:
    """Name the command that continues after a stop, for a command other than a job's
    (`batchrun serve` continues every batch when it starts again on the same root)."""
    global _resume
    _resume = command


def next_command() -> tuple[bool, str]:
    """How to go on after a stop: whether the job exists, and the command that continues it
    (or, for a submit stopped before it created the job, the same submit again)."""
    if _resume is not None:
        return True, _resume
    if _job_dir and _again and not os.path.exists(os.path.join(_job_dir, "manifest.json")):
        return False, _again
    if not _job_dir:
        return True, "batchrun resume"
    from batchrun.job.paths import command

    return True, ", then ".join(command(name, _job_dir) for name in ways_on(_job_dir, _retry))


def ways_on(job_dir: str, retry: bool) -> list[str]:
    """The commands that continue a job stopped mid-run, in order: `resume`, unless the run was
    a retry-failed (`retry`) that left failures: then `retry-failed`, after `resume` where
    requests are pending too."""
    if not retry:
        return ["resume"]
    # resume runs only requests with no finished attempt (and retries within --max-attempts),
    # so what a stopped retry-failed leaves failed is run again by retry-failed alone; the
    # order is the summary's advice's (console/render.py next_step): the pending ones first.
    pending, failed = _left(job_dir)
    if pending and failed:
        return ["resume", "retry-failed"]
    return ["resume"] if pending or not failed else ["retry-failed"]


def _left(job_dir: str) -> tuple[int, int]:
    """The job's pending and failed requests, as its manifest has them: counted when a run
    stops gracefully, as the run before left them when it stops at once (a retry-failed never
    adds to either). A manifest that cannot be read says none pending, some failed: a
    retry-failed runs only while failures are left."""
    from batchrun.errors import BatchrunError
    from batchrun.job.manifest import load_manifest
    from batchrun.job.paths import JobPaths

    try:
        counts = load_manifest(JobPaths(Path(job_dir))).counts
    except BatchrunError:
        counts = {}
    if not counts:
        return 0, 1
    return counts.get("pending", 0), counts.get("failed", 0)


def install() -> None:
    """Route SIGINT and SIGTERM through the graceful-then-immediate handler (main thread only)."""
    if signal.getsignal(signal.SIGINT) is _on_signal:
        return
    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)
    # Registered before any other exit handler of batchrun's, so it runs after them all.
    atexit.register(_ignore_late_signals)


def _ignore_late_signals() -> None:
    # Past this point nothing is left to stop, and Python's finalisation puts back the default
    # handlers, so a Ctrl-C now would end the process by signal (-2) instead of exit 130.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def exit_code() -> int | None:
    """130 or 143 once a stop signal came, else None."""
    if _first is None:
        return None
    return EXIT_TERMINATED if _first == signal.SIGTERM else EXIT_INTERRUPTED


def deliver_pending() -> None:
    """Raise the first stop signal's exception in the main thread, where the handler's own raise
    was lost (see the module's docstring); nothing when no stop signal came."""
    if _first is not None and threading.current_thread() is threading.main_thread():
        raise Terminated() if _first == signal.SIGTERM else KeyboardInterrupt()


def _on_signal(signum: int, frame: FrameType | None) -> None:
    global _first
    if _first is None:
        _first = signum
        raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()
    _stop_now()


def _stop_now() -> None:
    from batchrun.workers.process import kill_all_workers

    kill_all_workers()
    # Everything else this process started: a local Ray instance's daemons and agents, say,
    # which would otherwise outlive it (found before any is killed: an orphan loses its parent).
    for pid in descendants(os.getpid()):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    _, command = next_command()
    os.write(2, f"\nstopped at once; the journal is intact. Continue with: {command}\n".encode())
    code = exit_code()
    os._exit(code if code is not None else EXIT_INTERRUPTED)


def descendants(root: int) -> list[int]:
    """The pids of every live process below `root`."""
    import psutil  # here, not at import: the CLI's start-up stays lean

    try:
        return [p.pid for p in psutil.Process(root).children(recursive=True)]
    except psutil.Error:
        return []
