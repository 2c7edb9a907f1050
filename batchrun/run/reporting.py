"""What a run of the scheduler reports: to the person watching (Reporter), and in figures
(RunStats). Apart from the scheduler, so that its restart and hang policies can name them without
importing it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from batchrun.openai.records import Outcome


class Reporter(Protocol):
    """What the scheduler tells the person watching."""

    def event(self, message: str) -> None:
        """Something happened that a person should see (a worker started, died, backed off)."""
        ...

    def advance(self, outcomes: Sequence[Outcome]) -> None:
        """These outcomes were journaled."""
        ...


@dataclass
class RunStats:
    """What one run of the scheduler did."""

    outcomes: int = 0
    succeeded: int = 0
    failed: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    oom: bool = False
    crashed: int = 0

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens per second of this run."""
        return self.completion_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def prompt_tokens_per_s(self) -> float:
        """Prompt tokens per second of this run: the work of a pooling job, which generates
        none."""
        return self.prompt_tokens / self.seconds if self.seconds > 0 else 0.0
