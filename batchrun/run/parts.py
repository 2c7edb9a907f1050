"""What the scheduler tells its optional parts, as interfaces, and the null parts of a run
without them: `/metrics` (batchrun/metrics `RunMetrics` is one) and the job's event log
(job/events.py `EventLog` is one). A scheduler is always given both; the null ones do nothing."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from batchrun.openai.records import Outcome, Request


class RunFigures(Protocol):
    """What a run's metrics are told: each dispatch, result, journaled count, restart, back-off."""

    def dispatched(self, requests: Sequence[Request]) -> None:
        """These requests were just sent to a worker."""

    def results(self, pairs: Sequence[tuple[Outcome, Request]]) -> None:
        """These outcomes just came back from a worker."""

    def counted(
        self,
        outcomes: Sequence[Outcome],
        succeeded: int,
        prompt: int,
        completion: int,
        attempts: Mapping[str, int],
    ) -> None:
        """These outcomes were journaled (`attempts`: each custom_id's so far)."""

    def from_cache(self, requests: int) -> None:
        """Requests answered from the answer cache were journaled."""

    def restarted(self, reason: str) -> None:
        """A worker started again after `reason`."""

    def backed_off(self) -> None:
        """A worker backed off to a smaller batch after running out of memory."""


class Events(Protocol):
    """The job's event log (starts, restarts, back-offs), for `report`."""

    def write(self, kind: str, **fields: Any) -> None:
        """One event of `kind` now."""


class NullFigures:
    """The metrics of a run without /metrics: told everything, keeping nothing."""

    def dispatched(self, requests: Sequence[Request]) -> None:
        """Nothing to keep."""

    def results(self, pairs: Sequence[tuple[Outcome, Request]]) -> None:
        """Nothing to keep."""

    def counted(
        self,
        outcomes: Sequence[Outcome],
        succeeded: int,
        prompt: int,
        completion: int,
        attempts: Mapping[str, int],
    ) -> None:
        """Nothing to keep."""

    def from_cache(self, requests: int) -> None:
        """Nothing to keep."""

    def restarted(self, reason: str) -> None:
        """Nothing to keep."""

    def backed_off(self) -> None:
        """Nothing to keep."""


class NullEvents:
    """The event log of a run that keeps none."""

    def write(self, kind: str, **fields: Any) -> None:
        """Nothing to write."""
