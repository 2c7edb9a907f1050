"""What a person sees while a job runs: a progress bar, events, and the summary table at the end."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence

from tqdm import tqdm

from batchrun.openai.records import Outcome


class ProgressReporter:
    """A tqdm bar (requests done/total, requests/s, ETA) with generated tokens/s and failures."""

    def __init__(
        self, total: int, initial: int = 0, desc: str = "requests", enabled: bool = True
    ) -> None:
        self.started = time.monotonic()
        self.tokens = 0
        self.failed = 0
        self.done = 0
        self._last_postfix = 0.0
        tty = sys.stderr.isatty()
        self.bar = tqdm(
            total=total,
            initial=initial,
            desc=desc,
            unit="req",
            file=sys.stderr,
            dynamic_ncols=True,
            mininterval=0.2 if tty else 5.0,
            smoothing=0.05,
            disable=not enabled,
        )

    def event(self, message: str) -> None:
        """Print a line above the bar."""
        self.bar.write(f"[batchrun] {message}", file=sys.stderr)

    def advance(self, outcomes: Sequence[Outcome]) -> None:
        """Count journaled outcomes."""
        for o in outcomes:
            self.tokens += o.completion_tokens
            if not o.ok:
                self.failed += 1
        self.done += len(outcomes)
        now = time.monotonic()
        if now - self._last_postfix >= 0.5:
            self._last_postfix = now
            self.bar.set_postfix_str(self._postfix(now), refresh=False)
        self.bar.update(len(outcomes))

    def _postfix(self, now: float) -> str:
        elapsed = max(now - self.started, 1e-9)
        text = f"{self.tokens / elapsed:,.0f} tok/s"
        if self.failed:
            text += f", {self.failed} failed"
        return text

    def close(self) -> None:
        """Finish the bar."""
        self.bar.set_postfix_str(self._postfix(time.monotonic()), refresh=False)
        self.bar.close()
