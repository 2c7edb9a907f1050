"""The echo engine's fault injection, read from the environment: how tests make an engine fail the
way real ones do on GPUs (a start that raises, ranks that outlive their worker, a step that never
returns, a request that never finishes, an out-of-memory error tied to one request).

Every id list matches a request's custom_id; under `serve` the engine sees "<slot>\\x00<custom_id>"
and the part after the first separator is matched, so a fault names the line the same way under both.

- ``BATCHRUN_ECHO_START_ERROR``: every engine start raises ``RuntimeError(text)``.
- ``BATCHRUN_ECHO_START_ERROR_TIMES``: only the first N starts of the job raise it (counted in a
  file beside the worker's log, else in ``BATCHRUN_ECHO_STATE_DIR``, else in the temp directory
  keyed by the parent's pid).
- ``BATCHRUN_ECHO_START_HANG``: the first N starts of the job never finish (an NCCL set-up that
  never returns), counted like the start errors.
- ``BATCHRUN_ECHO_SPAWN_RANKS``: the engine starts N child processes that ignore SIGTERM and SIGINT
  and never exit on their own, as tensor-parallel ranks stuck in NCCL do; their pids are appended,
  one per line, to ``BATCHRUN_ECHO_RANK_PIDS`` when set.
- ``BATCHRUN_ECHO_HANG_AFTER``: after N results the engine's step never returns.
- ``BATCHRUN_ECHO_HANG_ON``: those requests never finish (the others do).
- ``BATCHRUN_ECHO_OOM_ON``: a step running one of those requests raises an out-of-memory error
  shaped like PyTorch's, whatever the batch size.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Between a batch's slot and a request's custom_id under serve (serve/router.py's SEP).
_SLOT_SEP = "\x00"

# A rank: ignores the signals a polite stop sends, sleeps forever, has no death signal.
_RANK_CODE = (
    "import signal, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
    "while True:\n"
    "    time.sleep(3600)\n"
)


def plain_id(engine_id: str) -> str:
    """The custom_id inside an engine's request id (the id itself outside serve)."""
    # After the first separator, as serve's router splits it: a custom_id may hold one too.
    return engine_id.split(_SLOT_SEP, 1)[-1]


def id_set(name: str) -> frozenset[str]:
    """The comma-separated custom_ids of environment variable `name`."""
    return frozenset(s.strip() for s in os.environ.get(name, "").split(",") if s.strip())


def env_int(name: str) -> int | None:
    """Environment variable `name` as an int (None when unset or empty)."""
    value = os.environ.get(name, "").strip()
    return int(value) if value else None


def raise_start_error() -> None:
    """Hang for BATCHRUN_ECHO_START_HANG's first starts; raise BATCHRUN_ECHO_START_ERROR's text,
    on every start or on the first _TIMES ones."""
    hangs = env_int("BATCHRUN_ECHO_START_HANG")
    if hangs and _count_start("echo-start-hangs.count") <= hangs:
        hang_forever()
    text = os.environ.get("BATCHRUN_ECHO_START_ERROR")
    if not text:
        return
    times = env_int("BATCHRUN_ECHO_START_ERROR_TIMES")
    if times is not None and _count_start("echo-starts.count") > times:
        return
    raise RuntimeError(text)


def _count_start(name: str) -> int:
    """Count this start in the job's counter file `name`; return how many there have been."""
    path = _state_dir() / name
    # One worker starts at a time per job here; an O_APPEND write of one byte is atomic anyway.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, b".")
    finally:
        os.close(fd)
    return path.stat().st_size


def _state_dir() -> Path:
    """Where counters that outlive one worker process live."""
    given = os.environ.get("BATCHRUN_ECHO_STATE_DIR")
    if given:
        return Path(given)
    log = os.environ.get("BATCHRUN_WORKER_LOG")
    if log:
        return Path(log).parent
    path = Path(tempfile.gettempdir()) / f"batchrun-echo-{os.getppid()}"
    path.mkdir(exist_ok=True)
    return path


def spawn_ranks() -> list[subprocess.Popen[bytes]]:
    """Start BATCHRUN_ECHO_SPAWN_RANKS stuck ranks; record their pids."""
    count = env_int("BATCHRUN_ECHO_SPAWN_RANKS") or 0
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", _RANK_CODE],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(count)
    ]
    record = os.environ.get("BATCHRUN_ECHO_RANK_PIDS")
    if ranks and record:
        with open(record, "a", encoding="utf-8") as f:
            f.write("".join(f"{rank.pid}\n" for rank in ranks))
    if ranks:
        with contextlib.suppress(OSError):
            sys.stderr.write(f"echo: rank pids {' '.join(str(r.pid) for r in ranks)}\n")
            sys.stderr.flush()
    return ranks


def hang_forever() -> None:
    """Never return, as an engine step stuck in a collective or the driver does."""
    while True:
        time.sleep(3600)
