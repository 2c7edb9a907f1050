"""The parent's large blocks go back to the system when freed (glibc's malloc tuned once).

A request of a long prompt is a block of hundreds of KB, and so are its answer, the batch pickled
for the worker and the journal's records. glibc's malloc serves blocks that large with mmap (given
back on free) only up to a threshold it raises each time such a block is freed, up to 32 MB: after
the first few, long prompts come from the heap, which fragments and keeps the file's worth of
peak memory. Fixing the threshold (which also stops it moving) keeps them mmapped. Measured on a
500 MB file of 2,000 long prompts: the parent's peak RSS 300 -> 220 MiB (docs/benchmarks.md).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import sys
from collections.abc import Iterator

from batchrun.workers.child import GC_THRESHOLD

# mallopt's parameter number for the mmap threshold (malloc.h), and the threshold: glibc's own
# starting value.
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 128 * 1024

_done = False


def return_large_blocks() -> None:
    """Fix glibc's mmap threshold for this process (once; nothing where libc is not glibc)."""
    global _done
    if _done or not sys.platform.startswith("linux"):
        return
    _done = True
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the process's own symbols, libc's among them
    except (OSError, AttributeError):  # musl and others: no mallopt, nothing to tune
        return
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)


@contextlib.contextmanager
def fewer_collections() -> Iterator[None]:
    """Collect the first generation every GC_THRESHOLD allocations meanwhile (unless disabled)."""
    old = gc.get_threshold()
    if 0 < old[0] < GC_THRESHOLD:
        gc.set_threshold(GC_THRESHOLD, *old[1:])
    try:
        yield
    finally:
        gc.set_threshold(*old)
