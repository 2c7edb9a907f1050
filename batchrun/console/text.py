"""Words for people: counts with the right plural."""

from __future__ import annotations


def plural(count: int, word: str, many: str | None = None) -> str:
    """`1 request`, `0 requests`, `1,204 requests`; `many` is an irregular plural."""
    return f"{count:,} {word if count == 1 else (many or word + 's')}"
