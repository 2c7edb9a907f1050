"""What a person sees while a job runs: a progress bar, events, and the summary table at the end."""

from __future__ import annotations

import importlib.util
import sys
import time
from collections.abc import Sequence
from typing import Any

from tqdm import tqdm

from batchrun.openai.records import Outcome

# Where stderr is a file or a pipe (a log, nohup, a batch system), a plain progress line this
# often instead of the bar: a bar redrawn with carriage returns turns a log into noise.
LOG_EVERY_S = 30.0


class ProgressReporter:
    """A tqdm bar (requests done/total, requests/s, ETA) with generated tokens/s and failures;
    where stderr is not a terminal, a plain progress line every `log_every_s` seconds instead."""

    def __init__(
        self,
        total: int,
        initial: int = 0,
        desc: str = "requests",
        enabled: bool = True,
        tty: bool | None = None,
        log_every_s: float = LOG_EVERY_S,
    ) -> None:
        self.started = time.monotonic()
        self.tokens = 0
        self.failed = 0
        self.done = 0
        self._last_postfix = 0.0
        self._total, self._initial, self._desc = total, initial, desc
        bar = tqdm
        if tty is None:
            # A Jupyter kernel's stderr is no terminal, but the notebook draws a bar.
            bar, tty = (notebook_bar(), True) if in_notebook() else (tqdm, sys.stderr.isatty())
        self._log_every_s = log_every_s if enabled and not tty else None
        self._last_log = self.started
        self.bar = bar(
            total=total,
            initial=initial,
            desc=desc,
            unit="req",
            file=sys.stderr,
            dynamic_ncols=True,
            mininterval=0.2,
            smoothing=0.05,
            disable=not (enabled and tty),
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
        if self._log_every_s is not None and now - self._last_log >= self._log_every_s:
            self._last_log = now
            self.event(self.line(now))
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

    def line(self, now: float) -> str:
        """Progress as one plain line: done/total, requests/s and tokens/s of this run, ETA."""
        elapsed = max(now - self.started, 1e-9)
        done = self._initial + self.done
        rate = self.done / elapsed
        text = f"{self._desc}: {done:,}/{self._total:,}"
        if self._total:
            text += f" ({done / self._total:.1%})"
        text += f", {rate:,.1f} req/s, {self._postfix(now)}"
        left = self._total - done
        if left > 0 and rate > 0:
            text += f", about {_duration(left / rate)} left"
        return text

    def close(self) -> None:
        """Finish the bar (or write the last progress line)."""
        now = time.monotonic()
        if self._log_every_s is not None and self.done and now - self._last_log >= 1.0:
            self.event(self.line(now))
        self.bar.set_postfix_str(self._postfix(now), refresh=False)
        self.bar.close()


def in_notebook() -> bool:
    """Whether this process is a Jupyter kernel (not a terminal IPython, not the CLI)."""
    shell = sys.modules.get("IPython")  # never imported here: a kernel has it already
    get_ipython = getattr(shell, "get_ipython", None)
    kernel = get_ipython() if get_ipython is not None else None
    return kernel is not None and type(kernel).__name__ == "ZMQInteractiveShell"


def notebook_bar() -> Any:
    """tqdm's notebook bar class (a widget), or the terminal bar's, which a notebook shows as
    text, where ipywidgets is not installed (tqdm's notebook bar raises without it)."""
    if importlib.util.find_spec("ipywidgets") is None:
        return tqdm
    from tqdm.notebook import tqdm as widget_bar

    return widget_bar


def _duration(seconds: float) -> str:
    """`seconds` as h:mm:ss (or m:ss under an hour)."""
    whole = int(seconds + 0.5)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"
