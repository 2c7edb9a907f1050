"""The media policy a test runs under (batchrun.openai.media): this process's reader uses it."""

from __future__ import annotations

from collections.abc import Iterator

from batchrun.openai.media import MediaPolicy, use_media_policy


def default_media_policy() -> Iterator[None]:
    """For an autouse fixture to yield from: the default policy before the test and after it."""
    use_media_policy(MediaPolicy())
    yield
    use_media_policy(MediaPolicy())
