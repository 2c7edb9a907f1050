"""The token ids a body names (logit_bias, allowed_token_ids, stop_token_ids) against the model's
vocabulary, said in one form wherever they are checked.

A job's lines are checked at validation, against the vocabulary sizes of its models' config.json
(vLLM's own `get_vocab_size` reads the same number): a line naming an id outside is an invalid
line with its line number, and never reaches an engine. The sizes are fixed in the job's manifest
when it is submitted, so that every later read of the input (resume, retry-failed, serve after a
restart) judges each line as submit did: a line invalid then is never run, one valid then never
turns invalid. The vLLM engine checks again with its own size (a job from an earlier version,
submitted without the sizes), with the same message.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from batchrun.openai.routing import KnownModels

# The body fields that name token ids; a body without any of them (nearly all) is not read.
TOKEN_ID_FIELDS = frozenset({"logit_bias", "allowed_token_ids", "stop_token_ids"})


def outside_vocab(field: str, tokens: Iterable[int], vocab_size: int) -> str | None:
    """The message for the first of body.`field`'s token ids outside a vocabulary of
    `vocab_size` ids; None when all are inside."""
    for token in tokens:
        if not 0 <= token < vocab_size:
            return (
                f"body.{field} names token id {token}, outside this model's vocabulary "
                f"(ids 0 to {vocab_size - 1})"
            )
    return None


def body_outside_vocab(body: Mapping[str, Any], vocab_size: int) -> str | None:
    """The message for a validated body's first token id outside the vocabulary (fields in the
    engine's order: logit_bias, allowed_token_ids, stop_token_ids); None when all are inside."""
    bias = body.get("logit_bias")
    # Validation saw to the shapes: logit_bias keys are decimal strings, the others int lists.
    fields: tuple[tuple[str, Iterable[int]], ...] = (
        ("logit_bias", map(int, bias) if isinstance(bias, dict) else ()),
        ("allowed_token_ids", body.get("allowed_token_ids") or ()),
        ("stop_token_ids", body.get("stop_token_ids") or ()),
    )
    for field, tokens in fields:
        message = outside_vocab(field, tokens, vocab_size)
        if message is not None:
            return message
    return None


@dataclass(frozen=True)
class Vocabularies:
    """The vocabulary size of each base model of a job, by its name, as submit found them.

    `known`: the names the job's lines were checked against when it was submitted (None: one
    model without adapters, whatever name a line gives), to find a line's base model.
    """

    sizes: Mapping[str, int]
    known: KnownModels | None = None

    def refusal(self, body: Mapping[str, Any]) -> str | None:
        """Why a validated body cannot run (a token id outside its model's vocabulary), or
        None; a model whose size is not known is not checked."""
        if TOKEN_ID_FIELDS.isdisjoint(body):
            return None
        if self.known is None:
            size = next(iter(self.sizes.values()), None) if len(self.sizes) == 1 else None
        else:
            model = body.get("model")
            size = self.sizes.get(self.known.base_of(model if isinstance(model, str) else None))
        return None if size is None else body_outside_vocab(body, size)
