"""An embeddings request's inputs as token ids, and its `dimensions` as vLLM's pooling takes it."""

from __future__ import annotations

from typing import Any

from batchrun.engines.vllm.errors import BadRequest
from batchrun.openai.params import EmbeddingParams


def embedding_prompts(
    tokenizer: Any, fields: EmbeddingParams, *, max_model_len: int, vocab_size: int
) -> list[list[int]]:
    """Each input of the request as token ids; one the model cannot take is a 400."""
    prompts: list[list[int]] = []
    for i, item in enumerate(fields.inputs):
        if isinstance(item, str):
            ids = [int(t) for t in tokenizer.encode(item)]
        else:
            ids = [int(t) for t in item]
            bad = next((t for t in ids if t >= vocab_size), None)
            if bad is not None:
                raise BadRequest(
                    f"body.input holds token id {bad}, outside this model's vocabulary "
                    f"(ids 0 to {vocab_size - 1})"
                )
        if len(ids) > max_model_len:
            where = "body.input" if fields.single else f"body.input[{i}]"
            raise BadRequest(
                f"this model's maximum context length is {max_model_len} tokens; "
                f"{where} has {len(ids)} tokens",
                code="context_length_exceeded",
            )
        prompts.append(ids)
    return prompts


def embedding_dimensions(
    dimensions: int | None, *, embedding_size: int, matryoshka: bool, model_name: str
) -> int | None:
    """`dimensions` for vLLM (None: the model's own size); a 400 if the model cannot shorten."""
    if dimensions is not None and dimensions == embedding_size:
        dimensions = None  # the model's own size: nothing to reduce
    if dimensions is not None and not matryoshka:
        raise BadRequest(
            f"body.dimensions {dimensions} is not supported with {model_name}: its "
            f"embeddings have {embedding_size} dimensions and cannot be shortened (it is "
            f"not a Matryoshka model); remove body.dimensions or set it to "
            f"{embedding_size}"
        )
    return dimensions
