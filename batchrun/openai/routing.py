"""What a line's `body.model` may name when a job has LoRA adapters: the base model's served
name, or one of the adapters. The reader checks lines against it (an unknown name is an error
record `model_not_found` listing the known names); without adapters a file names one model,
any name, as OpenAI's Batch API asks (the reader's `mixed_models` rule)."""

from __future__ import annotations

from dataclasses import dataclass

# OpenAI's own code for a request naming a model that does not exist.
MODEL_NOT_FOUND = "model_not_found"


@dataclass(frozen=True)
class KnownModels:
    """The names that answer a job's lines: its base model's and its adapters'."""

    base: str
    adapters: tuple[str, ...] = ()

    def __contains__(self, name: object) -> bool:
        return name == self.base or name in self.adapters

    def adapter(self, name: str | None) -> str | None:
        """The adapter a line's body.model names; None for the base (its name, or no name)."""
        return name if name is not None and name != self.base and name in self.adapters else None

    def unknown(self, model: str) -> str:
        """The error record's message for a line naming no model of the job."""
        names = ", ".join([f"{self.base} (the base model)", *sorted(self.adapters)])
        return f"body.model {model!r} is no model of this job; known: {names}"
