"""What the scheduler tells its optional parts, as interfaces, and the null parts of a run
without them: `/metrics` (batchrun/metrics `RunMetrics` is one) and the job's event log
(job/events.py `EventLog` is one). A scheduler is always given both; the null ones do nothing."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from batchrun.openai.records import Outcome, Request


class RunFigures(Protocol):
    """What a run's metrics are told: each dispatch, result, journaled count, restart, back-off.
    Each method does nothing unless a class implements it (NullFigures implements none)."""

    def dispatched(self, requests: Sequence[Request]) -> None:
        """These requests were just sent to a worker."""
        return None

    def results(self, pairs: Sequence[tuple[Outcome, Request]]) -> None:
        """These outcomes just came back from a worker."""
        return None

    def counted(
        self,
        outcomes: Sequence[Outcome],
        succeeded: int,
        prompt: int,
        completion: int,
        attempts: Mapping[str, int],
    ) -> None:
        """These outcomes were journaled (`attempts`: each custom_id's so far)."""
        return None

    def from_cache(self, requests: int) -> None:
        """Requests answered from the answer cache were journaled."""
        return None

    def restarted(self, reason: str) -> None:
        """A worker started again after `reason`."""
        return None

    def backed_off(self) -> None:
        """A worker backed off to a smaller batch after running out of memory."""
        return None


class Events(Protocol):
    """The job's event log (starts, restarts, back-offs), for `report`; `write` does nothing
    unless a class implements it (NullEvents)."""

    def write(self, kind: str, **fields: Any) -> None:
        """One event of `kind` now."""
        return None


class NullFigures(RunFigures):
    """The metrics of a run without /metrics: told everything, keeping nothing (the protocol's
    methods, which do nothing)."""


class NullEvents(Events):
    """The event log of a run that keeps none (the protocol's method, which writes nothing)."""
