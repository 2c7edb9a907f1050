"""Finding the request that crashes an engine worker, so that it fails alone and the job goes on.

When a worker dies (not out of memory) while holding requests, any of them may have killed it: a
tokenizer that chokes on one prompt, a sampling parameter the engine's C++ cannot hold. Those
requests become suspects. They run again in halves, each half alone on a worker: a half that
finishes clears its members; a half that kills the worker again is halved again, until the request
that kills a worker on its own is found. That request becomes a failed result of its own
(`engine_crash`, not retried) and everything else runs. Finding one such request among N suspects
costs at most ceil(log2 N) restarts beyond the death that raised the suspicion.

Out-of-memory deaths are isolated the same way once they look like one request's doing (the same
requests run out twice, or a handful of them do: run/restarts.py): a request whose own memory need
is the problem (prompt_logprobs over a long prompt, a large n) fails alone with `request_oom`.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from batchrun.openai.records import Outcome, Request
from batchrun.openai.response_bodies import failure

# Defined beside the worker that holds a group of them (workers/ is below run/); named here too.
from batchrun.workers.process import Suspects

# The error code of a request that crashed the engine worker on its own.
ENGINE_CRASH = "engine_crash"
# The error code of a request that ran the engine out of memory on its own.
REQUEST_OOM = "request_oom"
# This many requests in a row that crash the worker alone, with none finishing in between, and the
# engine itself (not the requests) is taken to be broken ...
BROKEN_ENGINE_STREAK = 8
# ... or this many when nothing at all has finished in the run yet.
BROKEN_ENGINE_STREAK_BEFORE_ANY_SUCCESS = 3


def restarts_bound(suspects: int) -> int:
    """The most restarts it can take to isolate one crashing request among `suspects`."""
    return math.ceil(math.log2(suspects)) if suspects > 1 else 0


def crash_outcome(request: Request, message: str, log: str | None) -> Outcome:
    """The failed result of a request that crashed the engine worker on its own."""
    where = f"; the worker's log: {log}" if log and log not in message else ""
    return failure(
        request,
        ENGINE_CRASH,
        f"the engine worker crashed while running this request on its own ({message}); "
        f"it is not retried{where}",
        status_code=500,
        # It would crash the next worker too: retrying it costs a restart each time for nothing.
        # `batchrun retry-failed` runs it again on demand (after an engine upgrade, say).
        retryable=False,
    )


def oom_outcome(request: Request, message: str) -> Outcome:
    """The failed result of a request that ran the engine out of memory on its own."""
    return failure(
        request,
        REQUEST_OOM,
        f"the engine ran out of memory running this request on its own ({message}); it needs "
        "more memory than the engine has (a long prompt with prompt_logprobs, a large n or "
        "logprobs, say); it is not retried",
        status_code=500,
        # It would run the next worker out of memory too; `retry-failed` sends it on demand.
        retryable=False,
    )


@dataclass
class Isolator:
    """The suspect groups still to run alone, and what isolating them has cost so far."""

    groups: deque[Suspects] = field(default_factory=deque)
    # Requests found to crash a worker alone, in all and in a row without a success between.
    found: int = 0
    streak: int = 0
    succeeded: int = 0

    def suspect(self, held: list[Request], deaths: int) -> None:
        """Queue what a dead worker held as two halves, each to run alone, before anything else.

        `deaths` counts the deaths that led here, this one included.
        """
        half = (len(held) + 1) // 2
        for part in (held[half:], held[:half]):
            if part:
                self.groups.appendleft(Suspects(part, deaths))

    def put_back(self, group: Suspects) -> None:
        """Return a group untested (its worker stopped for another reason) to the front."""
        if group.requests:
            self.groups.appendleft(group)

    def take(self, accept: Callable[[Suspects], bool] | None = None) -> Suspects | None:
        """The next group to run alone on a worker (of those `accept`s: a worker's model's
        when several run at once, run/lanes.py), if any."""
        for group in self.groups:
            if accept is None or accept(group):
                self.groups.remove(group)
                return group
        return None

    def on_success(self, count: int) -> None:
        """Requests finished: the engine can run requests, so a crash streak is broken."""
        if count:
            self.succeeded += count
            self.streak = 0

    def on_found(self) -> None:
        """One more request crashed a worker on its own."""
        self.found += 1
        self.streak += 1

    def engine_looks_broken(self) -> bool:
        """Whether the crashes look like the engine's fault rather than the requests'."""
        if self.succeeded == 0:
            return self.streak >= BROKEN_ENGINE_STREAK_BEFORE_ANY_SUCCESS
        return self.streak >= BROKEN_ENGINE_STREAK
