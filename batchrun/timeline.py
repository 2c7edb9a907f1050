"""A process's moments (validated, worker spawned, engine imported, first result, ...), each
stamped with the wall clock once, for the start-up and shutdown timeline a run keeps in its event
log (kind "timeline") and the benchmarks print: where the seconds before the first result and
after the last one go.

Wall-clock stamps, so that the parent's and a worker's moments line up on one axis (one machine;
a Ray worker's clock is its node's). Marking costs a dict lookup: the hot path may call it.
"""

from __future__ import annotations

import os
import time

_MARKS: dict[str, float] = {}


def mark(name: str) -> None:
    """Stamp `name` now, the first time only (a second pass does not move its start)."""
    if name not in _MARKS:
        _MARKS[name] = time.time()


def stamp(name: str) -> None:
    """Stamp `name` now, every time (the last result: the latest stamp is the one wanted)."""
    _MARKS[name] = time.time()


def marks() -> dict[str, float]:
    """This process's moments so far, rounded to the millisecond, its start among them."""
    found = {k: round(v, 3) for k, v in _MARKS.items()}
    started = process_start()
    if started is not None:
        found.setdefault("process_start", round(started, 3))
    return found


def clear() -> None:
    """Forget every moment (a worker process starting an engine again; tests)."""
    _MARKS.clear()


def process_start() -> float | None:
    """When this process started (wall clock, to the kernel's tick), or None where /proc has no
    answer (not Linux)."""
    try:
        with open(f"/proc/{os.getpid()}/stat", encoding="ascii") as f:
            stat = f.read()
        with open("/proc/uptime", encoding="ascii") as f:
            uptime = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    now = time.time()
    # The command name (field 2) may hold spaces and parentheses: count from its closing one.
    fields = stat[stat.rindex(")") + 2 :].split()
    ticks = int(fields[19])  # field 22, starttime, in clock ticks after boot
    # Against the uptime (to the hundredth of a second), not /proc/stat's btime (whole seconds).
    return now - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
