"""A histogram that takes many observations at a time, cheaply, for the scheduler's hot path.

prometheus_client's own Histogram takes a lock and walks its buckets per observation; the
scheduler observes each result, tens of thousands a second on the echo engine. Here a batch of
observations is one lock and one bisect each, and the exposition is built at scrape time.
"""

from __future__ import annotations

import threading
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from functools import partial

from prometheus_client.metrics_core import HistogramMetricFamily

# At most this many values are counted one by one; more are sorted first.
SMALL = 8


class FastHistogram:
    """Bucket counts and a sum, exposed as one Prometheus histogram family."""

    def __init__(self, name: str, documentation: str, buckets: Sequence[float]) -> None:
        self.name = name
        self.documentation = documentation
        self.bounds = [float(b) for b in buckets]
        self.counts = [0] * (len(self.bounds) + 1)  # the last: above every bound (+Inf)
        self.sum = 0.0
        self._lock = threading.Lock()

    def observe(self, value: float, count: int = 1) -> None:
        """`count` observations of `value`."""
        with self._lock:
            self.counts[bisect_left(self.bounds, value)] += count
            self.sum += value * count

    def observe_many(self, values: Sequence[float]) -> None:
        """One observation of each value: a few one by one, more by sorting them once and
        finding each bound in them (C loops, cheaper per value than one search each)."""
        n = len(values)
        if not n:
            return
        total = sum(values)
        counts, bounds = self.counts, self.bounds
        if n <= SMALL:
            with self._lock:
                for v in values:
                    counts[bisect_left(bounds, v)] += 1
                self.sum += total
            return
        ordered = sorted(values)
        # Values <= each bound ("le"), cumulative; the differences are each bucket's.
        below = list(map(partial(bisect_right, ordered), bounds))
        self._add_cumulative(below, n, total)

    def observe_since(self, now: float, times: list[float]) -> None:
        """One observation of `now - t` for each of `times` (when each began), binned from the
        times themselves: no list of differences is made."""
        n = len(times)
        if n <= SMALL:
            self.observe_many([now - t for t in times])
            return
        times.sort()
        total = n * now - sum(times)
        # now - t <= bound exactly when t >= now - bound: the times from there on.
        below = [n - bisect_left(times, now - bound) for bound in self.bounds]
        self._add_cumulative(below, n, total)

    def _add_cumulative(self, below: list[int], n: int, total: float) -> None:
        """Add `n` observations summing to `total`, given as how many are <= each bound
        (cumulative): each bucket gains the difference, the last the rest."""
        counts = self.counts
        with self._lock:
            previous = 0
            for i, at in enumerate(below):
                counts[i] += at - previous
                previous = at
            counts[-1] += n - previous
            self.sum += total

    @property
    def count(self) -> int:
        """Observations so far."""
        return sum(self.counts)

    def family(self) -> HistogramMetricFamily:
        """The family as a scrape shows it: cumulative buckets, +Inf, sum."""
        with self._lock:
            counts = list(self.counts)
            total = self.sum
        cumulative: list[tuple[str, float]] = []
        running = 0
        for bound, n in zip(self.bounds, counts, strict=False):
            running += n
            cumulative.append((_bound(bound), running))
        cumulative.append(("+Inf", running + counts[-1]))
        return HistogramMetricFamily(
            self.name, self.documentation, buckets=cumulative, sum_value=total
        )


def _bound(value: float) -> str:
    """A bucket bound as Prometheus clients write it (`1.0`, `0.005`)."""
    return repr(float(value))
