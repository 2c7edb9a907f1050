"""What a line's `body.model` may name when a job has LoRA adapters or several base models: a
base model's served name, or one of the adapters. The reader checks lines against it (an unknown
name is an error record `model_not_found` listing the known names); with one model and no
adapters a file names one model, any name, as OpenAI's Batch API asks (the reader's
`mixed_models` rule)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# OpenAI's own code for a request naming a model that does not exist.
MODEL_NOT_FOUND = "model_not_found"


@dataclass(frozen=True)
class KnownModels:
    """The names that answer a job's lines: its base models' and its adapters'.

    `base` is the first (or only) base model; `others` the further ones (`--model NAME=PATH`
    given more than once), and then every line must name a model. `adapter_bases` maps an
    adapter to its base model's name where that is not `base`.
    """

    base: str
    adapters: tuple[str, ...] = ()
    others: tuple[str, ...] = ()
    adapter_bases: tuple[tuple[str, str], ...] = ()

    def __contains__(self, name: object) -> bool:
        return name == self.base or name in self.adapters or name in self.others

    @property
    def bases(self) -> tuple[str, ...]:
        """Every base model's name, the first one first."""
        return (self.base, *self.others)

    @property
    def needs_name(self) -> bool:
        """Whether a line must name its model (several base models: none is the default)."""
        return bool(self.others)

    def adapter(self, name: str | None) -> str | None:
        """The adapter a line's body.model names; None for a base model (its name, or no name)."""
        return name if name is not None and name != self.base and name in self.adapters else None

    def base_of(self, name: str | None) -> str:
        """The base model that answers a line naming `name` (itself, or an adapter's base)."""
        if name in self.others:
            assert name is not None
            return name
        if name is not None and name in self.adapters:
            return dict(self.adapter_bases).get(name, self.base)
        return self.base

    def unknown(self, model: str | None) -> str:
        """The error record's message for a line naming no model of the job."""
        if self.others:
            names = ", ".join([*self.bases, *sorted(self.adapters)])
        else:
            names = ", ".join([f"{self.base} (the base model)", *sorted(self.adapters)])
        if model is None:
            return f"body.model is missing and this job runs several models; known: {names}"
        return f"body.model {model!r} is no model of this job; known: {names}"


def named_model(body: dict[str, Any], default: str) -> str:
    """The model a line's body names (a base model or an adapter), else `default` (the name
    answers report): what status counts a request under."""
    model = body.get("model")
    return model if isinstance(model, str) and model else default


def count_model(counts: dict[str, int], body: dict[str, Any], default: str) -> None:
    """Count one valid line under the model it names (`named_model`)."""
    name = named_model(body, default)
    counts[name] = counts.get(name, 0) + 1
