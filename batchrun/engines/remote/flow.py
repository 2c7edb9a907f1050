"""How many requests the remote engine keeps in flight: an AIMD window, the remote engine's
batch-size search. Pure logic over a clock the caller passes in; no I/O.

The window grows while latency holds and the window is in use: by one a success below the slow-start
threshold (doubling each round trip; the threshold is unbounded until the first congestion, then
the window a decrease left), by about a tenth a round trip above it (additive increase). It
shrinks on a congestion signal: by half on a 429, a 503 or 502 or 504, a timeout or a dropped
connection (`congested`); by a fifth when latency rises and the wider window buys no throughput
for it (the server queueing). One decrease per round trip at most: a burst of throttled answers to
requests sent together is one signal, not forty. A Retry-After holds every new send until it has
passed (`paused_until`). A server that stays away (a restart) shrinks the window further, one
decrease a round trip, but the threshold stays where the first decrease of the episode put it:
once answers come again the window doubles back up to it, as TCP's does.

"Latency holds" is judged by what the latency buys. By Little's law the requests in flight over
the latency per generated token is the tokens a second (`rate`). A server that only queues what
it is sent beyond its capacity answers each later and no faster: its rate stops growing with the
window. So the window shrinks when it has grown half again past the window of the best rate seen
with no better rate since (a round trip of answers after it), or when the recent latency per token
jumps above twice its long-run level without the rate growing with it. On a server whose every
step costs more the more it batches (a CPU), latency rises with the window while the rate still
grows: that is not congestion, and the window keeps growing.

Latency is taken per generated token (`latency_s / completion_tokens`, raw for answers that
generate none: embeddings, score): answers of different lengths then compare.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Where a window starts (or the cap, when that is lower): what vLLM batches at once by default
# (its max_num_seqs is 128 to 256); a server that cannot take it says so (429, 503, queueing)
# and the window comes down. Lines wait for the window only while it grows: started at 64, a
# job of 150 lines sent its last ones 84 s in (one more each answer), and took 0.82x the time of
# sending all 150 at once on a CPU vllm serve (docs/benchmarks.md).
START_WINDOW = 128
# Recent and long-run latency: exponentially weighted means of each success's latency per token.
SHORT_WEIGHT = 0.3
LONG_WEIGHT = 0.05
# The recent latency this many times the long-run one is the server queueing, unless the recent
# throughput is this many times the long-run one (the window bought it).
RISE = 2.0
GAIN = 1.1
# The window this many times the best round trip's, with a rate no better: saturated.
SATURATED = 1.5
# A round trip's rate is a better one when it beats the best by this much (noise is not).
BETTER = 1.03
# The best rate fades by this factor a round trip, so a server whose load changes is re-learnt.
FADE = 0.999
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
    # Tokens a second through the window (in flight over latency per token), recent and long-run.
    short_rate: float | None = None
    long_rate: float | None = None
    # The best round trip's rate and its mean window; this round trip's answers so far (a round
    # trip: as many answers as the window held when it began), their rates and windows summed.
    best_rate: float = 0.0
    best_window: float = 0.0
    trip_answers: int = 0
    trip_length: int = 0
    trip_rates: float = 0.0
    trip_windows: float = 0.0
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
        rate = min(self.limit(), in_flight + 1) / max(sample, 1e-9)
        self.samples += 1
        self.answered_since_decrease = True
        if self.round_trip is None:
            self.round_trip = latency_s
        else:
            self.round_trip += SHORT_WEIGHT * (latency_s - self.round_trip)
        if (
            self.short_latency is None
            or self.long_latency is None
            or self.short_rate is None
            or self.long_rate is None
        ):
            self.short_latency = self.long_latency = sample
            self.short_rate = self.long_rate = rate
        else:
            self.short_latency += SHORT_WEIGHT * (sample - self.short_latency)
            self.long_latency += LONG_WEIGHT * (sample - self.long_latency)
            self.short_rate += SHORT_WEIGHT * (rate - self.short_rate)
            self.long_rate += LONG_WEIGHT * (rate - self.long_rate)
        # A window not in use (a job's last lines, fewer than it holds) says nothing of the
        # server: its rate falls with the lines left, not with the server's capacity.
        in_use = in_flight + 1 >= self.limit()
        saturated = in_use and self._round_trip(rate)
        if saturated or (self.samples >= MIN_SAMPLES and self._jumped()):
            self._decrease(now, LATENCY_FACTOR)
            return
        if not in_use:
            return  # a larger window would tell nothing either
        if self.window < self.ssthresh:
            self.window = min(float(self.cap), self.window + 1.0)
        else:
            step = max(1.0, GROWTH * self.window) / self.window
            self.window = min(float(self.cap), self.window + step)

    def _round_trip(self, rate: float) -> bool:
        """Count an answer into this round trip; at its end, whether the window grew half again
        past the best round trip's with no better rate (saturated: see the module's docstring)."""
        if self.trip_length == 0:
            self.trip_length = self.limit()
        self.trip_answers += 1
        self.trip_rates += rate
        self.trip_windows += self.window
        if self.trip_answers < self.trip_length:
            return False
        mean_rate = self.trip_rates / self.trip_answers
        mean_window = self.trip_windows / self.trip_answers
        self.trip_answers = self.trip_length = 0
        self.trip_rates = self.trip_windows = 0.0
        self.best_rate *= FADE
        if mean_rate > BETTER * self.best_rate:
            self.best_rate, self.best_window = mean_rate, mean_window
            return False
        return mean_window >= SATURATED * self.best_window

    def _jumped(self) -> bool:
        """Whether the recent latency per token jumped without the rate growing with it."""
        assert self.short_latency is not None and self.long_latency is not None
        assert self.short_rate is not None and self.long_rate is not None
        jumped = self.short_latency > RISE * self.long_latency
        return jumped and self.short_rate < GAIN * self.long_rate

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
