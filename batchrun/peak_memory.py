"""This process's own peak resident memory.

`getrusage(RUSAGE_SELF).ru_maxrss` is not it on Linux: the kernel carries the high-water mark
across execve, so a process started by a large one (a pytest worker that loaded torch, a parent
that held a big file) reports its spawner's peak as its own. /proc/self/status's `VmHWM` belongs
to the process's own address space, made new at exec; ru_maxrss is the fallback elsewhere.
"""

from __future__ import annotations

import resource


def peak_rss_kib() -> int:
    """The peak resident set size of this process since its exec, in KiB."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
