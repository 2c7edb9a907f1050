"""How much a worker holds beyond its window: enough queued in it that a worker whose results
the parent is still journaling always has work in hand, bounded in count and in prompt bytes."""

from __future__ import annotations

# Requests a worker holds beyond its window, queued in the worker for the moment one finishes:
# as many again (at most this many), so that a worker whose results the parent is still
# journaling always has work in hand. Isolating a poison request costs log2 of what it held.
MAX_PREFETCH = 2048
# ... and at most about this many prompt characters of them: 256 prefetched prompts of 250 KB
# each would hold 64 MB more in the parent (issue 28: a file of long prompts in bounded memory).
MAX_PREFETCH_CHARS = 16 * 2**20


def held_at_most(window: int, request_chars: int = 0) -> int:
    """The most requests a worker with this window holds at once: the window plus prefetch,
    fewer prefetched when requests are long (`request_chars`: a recent request's prompt)."""
    prefetch = min(MAX_PREFETCH, max(4, window))
    if request_chars > 0:
        prefetch = min(prefetch, max(4, MAX_PREFETCH_CHARS // request_chars))
    return window + prefetch
