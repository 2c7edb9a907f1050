"""How many requests the remote engine keeps in flight: an AIMD window, the remote engine's
batch-size search. Pure logic over a clock the caller passes in; no I/O.

The window grows while latency holds and the window is in use: by one a success below the slow-start
threshold (doubling each round trip; the threshold is unbounded until the first congestion, then
the window a decrease left), by about a tenth a round trip above it (additive increase). It
shrinks on a congestion signal: by half on a 429, a 503 or 502 or 504, a timeout or a dropped
connection (`congested`), by a fifth when the recent latency per generated token rises above
twice its long-run level (the server queueing). One decrease per round trip at most: a burst of
throttled answers to requests sent together is one signal, not forty. A Retry-After holds every
new send until it has passed (`paused_until`). A server that stays away (a restart) shrinks the
window further, one decrease a round trip, but the threshold stays where the first decrease of the
episode put it: once answers come again the window doubles back up to it, as TCP's does.

Latency is taken per generated token (`latency_s / completion_tokens`, raw for answers that
generate none: embeddings, score): answers of different lengths then compare.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Where a window starts (or the cap, when that is lower): enough to fill a small server at once.
START_WINDOW = 16
# Recent and long-run latency: exponentially weighted means of each success's latency per token.
SHORT_WEIGHT = 0.3
LONG_WEIGHT = 0.05
# The recent latency this many times the long-run one is the server queueing.
RISE = 2.0
# Successes seen before a latency rise is believed (the means need samples to mean anything).
MIN_SAMPLES = 8
# Additive increase: about this fraction of the window per round trip (at least one request).
GROWTH = 0.1
# Multiplicative decreases: on a congestion signal, and on rising latency.
CONGESTION_FACTOR = 0.5
LATENCY_FACTOR = 0.8
# The shortest gap between two decreases when no latency is known yet (seconds).
MIN_GAP_S = 1.0


@dataclass
class FlowWindow:
    """The AIMD window: `limit()` requests may be in flight; told of every answer."""

    cap: int
    window: float = 0.0
    # Below it, slow start; set by the first decrease after a success (an episode's start).
    ssthresh: float = math.inf
    short_latency: float | None = None
    long_latency: float | None = None
    # A success's whole latency, recent mean: a round trip, the shortest gap between decreases.
    round_trip: float | None = None
    samples: int = 0
    last_decrease: float = -math.inf
    # Whether a success came since the last decrease: the next decrease starts a new episode.
    answered_since_decrease: bool = True
    paused_until: float = 0.0
    decreases: int = 0

    def __post_init__(self) -> None:
        if self.cap < 1:
            raise ValueError(f"the cap must be at least 1, got {self.cap}")
        if self.window <= 0:
            self.window = float(min(START_WINDOW, self.cap))

    def limit(self) -> int:
        """How many requests may be in flight now."""
        return max(1, min(self.cap, int(self.window)))

    def settled(self) -> int:
        """The window as the job shows it (its batch size)."""
        return self.limit()

    def paused(self, now: float) -> bool:
        """Whether a Retry-After still holds new sends back."""
        return now < self.paused_until

    def succeeded(self, now: float, latency_s: float, tokens: int, in_flight: int) -> None:
        """A success: grow while latency holds and the window is used, shrink when it rises.
        `in_flight`: requests running or waiting for the window when it came back."""
        sample = latency_s / tokens if tokens > 0 else latency_s
        self.samples += 1
        self.answered_since_decrease = True
        if self.round_trip is None:
            self.round_trip = latency_s
        else:
            self.round_trip += SHORT_WEIGHT * (latency_s - self.round_trip)
        if self.short_latency is None or self.long_latency is None:
            self.short_latency = self.long_latency = sample
        else:
            self.short_latency += SHORT_WEIGHT * (sample - self.short_latency)
            self.long_latency += LONG_WEIGHT * (sample - self.long_latency)
        if self.samples >= MIN_SAMPLES and self.short_latency > RISE * self.long_latency:
            self._decrease(now, LATENCY_FACTOR)
            return
        if in_flight + 1 < self.limit():
            return  # not using the window: a larger one would tell nothing
        if self.window < self.ssthresh:
            self.window = min(float(self.cap), self.window + 1.0)
        else:
            step = max(1.0, GROWTH * self.window) / self.window
            self.window = min(float(self.cap), self.window + step)

    def congested(self, now: float, retry_after_s: float | None = None) -> None:
        """A 429, 502/503/504, a timeout or a dropped connection: halve (once a round trip), and
        hold new sends for the Retry-After the server asked for."""
        if retry_after_s is not None and retry_after_s > 0:
            self.paused_until = max(self.paused_until, now + retry_after_s)
        self._decrease(now, CONGESTION_FACTOR)

    def _decrease(self, now: float, factor: float) -> None:
        gap = max(MIN_GAP_S, self.round_trip or 0.0)
        if now - self.last_decrease < gap:
            return
        self.last_decrease = now
        self.decreases += 1
        self.window = max(1.0, self.window * factor)
        if self.answered_since_decrease:  # a new episode: where slow start will stop
            self.ssthresh = self.window
            self.answered_since_decrease = False
