"""Words for people: counts with the right plural, and commands that paste back into a shell."""

from __future__ import annotations

import shlex
from pathlib import Path


def plural(count: int, word: str, many: str | None = None) -> str:
    """`1 request`, `0 requests`, `1,204 requests`; `many` is an irregular plural."""
    return f"{count:,} {word if count == 1 else (many or word + 's')}"


def command(name: str, job_dir: Path | str, *extra: str) -> str:
    """`batchrun NAME --job-dir DIR ...`, shell-quoted: a directory with spaces pastes back whole."""
    return shlex.join(["batchrun", name, "--job-dir", str(job_dir), *extra])
