"""A worker's process tree: the worker leads a session (and process group) of its own, so that
everything it starts (vLLM's engine-core process, one process per tensor-parallel rank, which
have no death signal of their own) can be killed with it as one group.

The group's id is the worker's pid. It outlives the worker while any member lives, so the parent
can kill a dead worker's ranks by the pid it knew (`kill_group`), and wait until they are gone
(`wait_group_gone`) before it starts another engine on the same GPUs.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time
from types import FrameType

PR_SET_PDEATHSIG = 1
# The signal Linux sends the worker when its parent dies. Not SIGKILL: that would kill the worker
# alone and leave its ranks running; a handler kills the whole group. Not SIGTERM or SIGINT: the
# worker sets those aside (the parent decides how to stop). Nothing else sends SIGUSR2 here.
PARENT_DEATH_SIGNAL = signal.SIGUSR2
# The exit status of a worker whose parent was gone before the death signal was armed.
PARENT_GONE_EXIT = 5
# How long the parent waits for a killed group to be gone: a process stuck in a driver call dies
# only when the call returns, so the wait is bounded and the parent goes on after it.
GROUP_GONE_TIMEOUT_S = 10.0


def lead_own_group() -> bool:
    """Make this process the leader of a new session (and process group); True if it leads one.

    A session rather than a group: no controlling terminal, so a worker writing to the terminal
    can never be stopped by job control (SIGTTOU) as a background group of the shell's session
    would, and the terminal's Ctrl-C and hangup reach the parent only.
    """
    with contextlib.suppress(OSError):
        os.setsid()
    return os.getpgrp() == os.getpid()


def die_with_parent(parent_pid: int) -> None:
    """Kill this process's group when its parent dies; exit now if the parent is already gone.

    Linux sends PARENT_DEATH_SIGNAL when the parent ends (kill -9 included); the handler kills the
    group this process leads (itself and every rank it started). The parent may die before the
    signal is armed (the worker spends a second starting Python first): then this process has
    been handed to another parent already, and it exits at once.
    """
    if not sys.platform.startswith("linux"):
        return
    signal.signal(PARENT_DEATH_SIGNAL, _on_parent_death)
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, PARENT_DEATH_SIGNAL)
    if os.getppid() != parent_pid:
        os._exit(PARENT_GONE_EXIT)


def _on_parent_death(signum: int, frame: FrameType | None) -> None:
    """The parent died: kill this process's group (itself included), or itself alone if it
    leads none (never the group it shares with the dead parent's other processes)."""
    if os.getpgrp() == os.getpid():
        os.killpg(os.getpid(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def kill_group(pgid: int) -> None:
    """SIGKILL every process of group `pgid` (a worker's pid); nothing if the group is gone.

    A worker that has not made its group yet (still starting Python) has started nothing either:
    the caller kills that process itself. A group id is never the parent's own group (the worker
    is not the parent's group leader), so this cannot hit the parent.
    """
    with contextlib.suppress(OSError):
        os.killpg(pgid, signal.SIGKILL)


def group_members(pgid: int) -> list[int]:
    """The live processes of group `pgid` (zombies, already dead, are not counted)."""
    try:
        entries = os.listdir("/proc")
    except OSError:  # no /proc: ask the kernel whether anything is left in the group
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return []
        except OSError:
            pass
        return [pgid]
    members = []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) >= 3 and fields[0] != b"Z" and int(fields[2]) == pgid:
            members.append(int(entry))
    return members


def wait_group_gone(pgid: int, timeout: float = GROUP_GONE_TIMEOUT_S) -> bool:
    """Wait until group `pgid` has no live process, up to `timeout` seconds; True if it has none."""
    deadline = time.monotonic() + timeout
    while group_members(pgid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True
