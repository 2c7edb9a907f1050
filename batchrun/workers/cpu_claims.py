"""Which CPU cores other batchrun jobs on this machine run their models on.

A job whose model runs on the CPU pins its workers to cores (workers/cpu_layout.py). Two such jobs
on one machine would pin to the same cores, and OpenMP threads that wait for each other at every
layer stall when another process takes their core. So each job holds a claim: a small file
naming its cores, locked (flock) for as long as its process lives. A job starting next picks the
cores no live claim holds, or, when every core is held, says so. A claim whose lock is free
belongs to a process that is gone (kill -9 included: the kernel drops its locks) and is removed.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO

# The claims of every user's jobs in one place: they share the machine's cores.
CLAIMS_ENV = "BATCHRUN_CPU_CLAIMS_DIR"


@dataclass(frozen=True)
class Claim:
    """Another live job's cores."""

    pid: int
    cores: tuple[int, ...]
    job: str


# This process's own claim (its file, held open and so locked) until it exits or claims again.
_held: tuple[IO[str], Path] | None = None


def claims_dir() -> Path:
    """Where the claims are: $BATCHRUN_CPU_CLAIMS_DIR, else batchrun-cpu-claims in /tmp."""
    configured = os.environ.get(CLAIMS_ENV)
    return Path(configured) if configured else Path(tempfile.gettempdir()) / "batchrun-cpu-claims"


def live_claims(directory: Path | None = None) -> list[Claim]:
    """The claims of other live processes; stale ones (their process gone) are removed."""
    directory = directory or claims_dir()
    try:
        names = sorted(p for p in directory.iterdir() if p.suffix == ".json")
    except OSError:
        return []
    found: list[Claim] = []
    for path in names:
        if _held is not None and path == _held[1]:
            continue
        claim = _read_if_live(path)
        if claim is not None:
            found.append(claim)
    return found


def hold_claim(cores: list[int], job: str, directory: Path | None = None) -> None:
    """Claim `cores` for this process (replacing its earlier claim) until it exits."""
    global _held
    release_claim()
    directory = directory or claims_dir()
    try:
        directory.mkdir(mode=0o1777, exist_ok=True)
        # Locked before it is visible (the lock follows the file through the rename), so a job
        # looking at the same moment never takes it for a stale one.
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.getpid()}-", suffix=".tmp")
        handle = os.fdopen(fd, "w", encoding="utf-8")
        fcntl.flock(handle, fcntl.LOCK_SH)
        handle.write(json.dumps({"pid": os.getpid(), "cores": cores, "job": job}))
        handle.flush()
        final = directory / (Path(tmp).name[1:].removesuffix(".tmp") + ".json")
        os.rename(tmp, final)
    except OSError:
        return  # no claims on this machine (a read-only /tmp): the jobs still run
    _held = (handle, final)


def release_claim() -> None:
    """Give up this process's claim (its cores are free for the next job)."""
    global _held
    if _held is None:
        return
    handle, path = _held
    if not path.name.startswith(f"{os.getpid()}-"):
        return  # a forked copy of the process that claimed them: not this one's to give up
    with contextlib.suppress(OSError):
        path.unlink()
    with contextlib.suppress(OSError):
        handle.close()
    _held = None


# A clean exit leaves no file behind (a kill leaves a stale one, removed by the next look).
atexit.register(release_claim)


def _read_if_live(path: Path) -> Claim | None:
    """The claim in `path` if its process still holds it; a stale claim is removed."""
    try:
        with path.open(encoding="utf-8") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                data = json.loads(f.read() or "{}")
                cores = tuple(int(c) for c in data.get("cores", ()))
                return Claim(int(data.get("pid", 0)), cores, str(data.get("job", "")))
            # Nobody holds it: its process is gone.
            with contextlib.suppress(OSError):
                path.unlink()
            return None
    except (OSError, ValueError, TypeError):
        return None
