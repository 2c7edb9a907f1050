"""Process trees and groups: what a batchrun process started, and what is still alive."""

from __future__ import annotations

import contextlib
import os

import psutil


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
