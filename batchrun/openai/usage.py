"""The token details of an answer's `usage`, read by msgspec wherever batchrun sums or shows
them: the prompt tokens found cached and the reasoning tokens, under chat's and completions'
names (`prompt_tokens_details`, `completion_tokens_details`) or a Response's (`input_...`,
`output_tokens_details`)."""

from __future__ import annotations

import msgspec


class UsageDetails(msgspec.Struct):
    """One of a usage's `*_tokens_details` objects."""

    cached_tokens: int | None = None
    reasoning_tokens: int | None = None


class DetailedUsage(msgspec.Struct):
    """The token-details objects of a usage (a body holds one name of each pair)."""

    prompt_tokens_details: UsageDetails | None = None
    completion_tokens_details: UsageDetails | None = None
    input_tokens_details: UsageDetails | None = None
    output_tokens_details: UsageDetails | None = None

    def cached_tokens(self) -> int:
        """The prompt tokens the engine found in its prefix cache (0 when not reported)."""
        details = self.prompt_tokens_details or self.input_tokens_details
        return int((details and details.cached_tokens) or 0)

    def reasoning_tokens(self) -> int:
        """The completion tokens spent reasoning (0 when not reported)."""
        details = self.completion_tokens_details or self.output_tokens_details
        return int((details and details.reasoning_tokens) or 0)
