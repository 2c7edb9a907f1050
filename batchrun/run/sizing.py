"""Batch-size search and out-of-memory back-off: pure logic, no I/O.

The search has two phases. First, a binary search over the powers of two between `lo` and `hi`
(and `hi` itself) for the largest size that starts and runs without running out of memory; it tries
`hi` first because on most set-ups it fits, which makes the common case one probe. Second, from that
size downwards, halving while the measured throughput improves: past the knee a bigger batch only
adds latency, so the best size is the fastest one seen, not the largest.

A pooling job (embeddings, score, rerank) has no second phase (`walk_down=False`): it generates
nothing, so each engine step is bounded by vLLM's token budget (`max_num_batched_tokens`), not by
the batch, and a smaller window can only leave steps part empty (64 passages of 45 tokens fill 70%
of a CPU's 4096). Its best size is the largest that runs: one probe where the top fits. Before,
the walk down chose a window on noise and on the first probe's warm-up (which makes the top look
slow), and ran the job with part-empty steps.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

# A smaller size must beat the larger one by this much to be preferred (measurements are noisy).
IMPROVEMENT = 1.05


@dataclass
class Probe:
    """One measured try of a batch size."""

    size: int
    ok: bool
    requests: int = 0
    seconds: float = 0.0
    # The measure the search compares: tokens per second of what the endpoint's work is made of,
    # `unit` says which (generated tokens for generation; prompt tokens for a pooling job, which
    # generates none: embeddings, score, rerank).
    tokens_per_s: float = 0.0
    peak_memory_mb: float | None = None
    note: str = ""
    unit: str = "generated tok/s"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready copy."""
        return asdict(self)


def candidate_sizes(lo: int, hi: int) -> list[int]:
    """The sizes the search may try: powers of two in [lo, hi], plus lo and hi themselves."""
    if lo < 1 or hi < lo:
        raise ValueError(f"batch size bounds must satisfy 1 <= lo <= hi, got {lo}..{hi}")
    sizes = {lo, hi}
    p = 1
    while p <= hi:
        if p >= lo:
            sizes.add(p)
        p *= 2
    return sorted(sizes)


@dataclass
class BatchSizeSearch:
    """Decides which size to probe next from the results of earlier probes."""

    lo: int
    hi: int
    probes: list[Probe] = field(default_factory=list)
    # Phase 2, the walk down from the largest size that runs (not for a pooling job: see above).
    walk_down: bool = True

    def __post_init__(self) -> None:
        self.sizes = candidate_sizes(self.lo, self.hi)
        self._ok_max: int | None = None  # index into sizes of the largest size that ran
        self._bad_min: int | None = None  # index of the smallest size that ran out of memory

    def report(self, probe: Probe) -> None:
        """Record a probe's result."""
        self.probes.append(probe)
        idx = self.sizes.index(probe.size) if probe.size in self.sizes else None
        if idx is None:
            return
        if probe.ok:
            if self._ok_max is None or idx > self._ok_max:
                self._ok_max = idx
        elif self._bad_min is None or idx < self._bad_min:
            self._bad_min = idx

    def next_size(self) -> int | None:
        """The next size to probe, or None when the search is over."""
        if not self.probes:
            return self.sizes[-1]
        if self._ok_max is None and self._bad_min == 0:
            return None  # even the smallest size runs out of memory
        hi_bad = self._bad_min if self._bad_min is not None else len(self.sizes)
        lo_ok = self._ok_max if self._ok_max is not None else -1
        if hi_bad - lo_ok > 1:
            # Phase 1: bisect between the largest good and the smallest bad size.
            return (
                self.sizes[(lo_ok + hi_bad) // 2] if lo_ok >= 0 else self.sizes[(hi_bad - 1) // 2]
            )
        if not self.walk_down:
            return None
        # Phase 2: walk down from the largest good size while throughput improves.
        tried = {p.size: p for p in self.probes if p.ok}
        idx = lo_ok
        while idx > 0 and self.sizes[idx] in tried:
            below = self.sizes[idx - 1]
            if below not in tried:
                current = tried[self.sizes[idx]]
                best_other = self.best()
                if best_other is not None and best_other.size != current.size:
                    return None  # a larger size already won; the knee is passed
                return below
            if tried[below].tokens_per_s < tried[self.sizes[idx]].tokens_per_s * IMPROVEMENT:
                return None
            idx -= 1
        return None

    def best(self) -> Probe | None:
        """The fastest size that ran, the larger one on a near tie; without the walk down, the
        largest that ran."""
        ok = [p for p in self.probes if p.ok]
        if not ok:
            return None
        if not self.walk_down:
            return max(ok, key=lambda p: p.size)
        best = ok[0]
        for p in ok[1:]:
            if p.tokens_per_s > best.tokens_per_s * IMPROVEMENT or (
                p.tokens_per_s >= best.tokens_per_s / IMPROVEMENT and p.size > best.size
            ):
                best = p
        return best


def back_off(size: int) -> int | None:
    """The size to retry with after an out-of-memory failure at `size`; None below 1."""
    smaller = size // 2
    return smaller if smaller >= 1 else None
