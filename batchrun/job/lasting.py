"""Failures a retry cannot fix: requests the engine refused as written (a 400), which fail the
same way however often they are sent, so `retry-failed` is never the advice for them.

Counted from the job's fold, as every figure is (job/figures.py): the failed attempts by error
code that the summary keeps (job/timing.py, `failed_by_code`), at most the job's failed requests.
Exact for a job whose refused requests were not sent again; one sent again by hand
(`retry-failed`) counts once per attempt, still at most the failed requests. What fixes each
kind, and the command that does it, is the advice's (console/render.py `next_step`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

CONTEXT = "context_length_exceeded"
# The codes of an attempt refused as written (a 400 from the engine: the prompt and max_tokens
# over the context, a parameter the model cannot take, a chat template that refuses the messages,
# media it cannot read), in the order the advice names them.
AS_WRITTEN = (CONTEXT, "invalid_request", "invalid_media")


@dataclass(frozen=True)
class Lasting:
    """A job's failed requests that a retry cannot fix, by error code (AS_WRITTEN's order)."""

    by_code: dict[str, int]

    @property
    def count(self) -> int:
        """Failed requests a retry cannot fix."""
        return sum(self.by_code.values())

    @property
    def too_long(self) -> int:
        """Of them, requests longer than the context (context_length_exceeded)."""
        return self.by_code.get(CONTEXT, 0)

    @property
    def refused(self) -> int:
        """Of them, requests the engine refused for what they hold (the input must change)."""
        return self.count - self.too_long


def lasting_failures(errors: Mapping[str, Any] | None, failed: int) -> Lasting:
    """Of a job's `failed` requests, those a retry cannot fix, from its errors tally (the
    `errors` of status and of job/figures.py's timing)."""
    codes = (errors or {}).get("failed_by_code") or {}
    left = failed
    by_code: dict[str, int] = {}
    for code in AS_WRITTEN:
        n = min(int(codes.get(code) or 0), left)
        if n > 0:
            by_code[code] = n
            left -= n
    return Lasting(by_code)
