"""Process trees and groups: what a batchrun process started, and what is still alive."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path

import psutil

from support.waits import results_at_least, wait_until


def worker_pids(parent_pid: int) -> list[int]:
    """The engine worker processes of a batchrun process (they are named batchrun-worker)."""
    found = []
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process(parent_pid).children():
            with contextlib.suppress(psutil.Error):
                if "batchrun-worker" in " ".join(child.cmdline()):
                    found.append(child.pid)
    return found


def group_alive(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group `pgid`."""
    alive = []
    for p in psutil.process_iter(["status"]):
        with contextlib.suppress(psutil.Error, OSError):
            if p.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(p.pid) == pgid:
                alive.append(p.pid)
    return alive


def kill_group(proc: subprocess.Popen[str]) -> None:
    """SIGKILL `proc`'s process group if it still runs (a test that gives up first), and reap it."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def kill_9_after(proc: subprocess.Popen[str], job: Path, n: int, timeout: float = 120) -> None:
    """Wait until `job` has journaled `n` records, then SIGKILL `proc`'s process group (whatever
    the wait came to) and reap it: a job killed mid-run, to resume."""
    try:
        wait_until(results_at_least(job, n), f"{n} results are journaled", timeout=timeout)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
