"""Words for people: counts with the right plural, and commands that paste back into a shell."""

from __future__ import annotations

# Defined beside the job's paths (job/ is below console/, and its messages name commands too).
from batchrun.job.paths import command as command


def plural(count: int, word: str, many: str | None = None) -> str:
    """`1 request`, `0 requests`, `1,204 requests`; `many` is an irregular plural."""
    return f"{count:,} {word if count == 1 else (many or word + 's')}"
