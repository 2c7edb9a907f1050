"""An embeddings request's inputs as token ids, its `dimensions` as vLLM's pooling takes it, and
its outcome from the vectors vLLM pools."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from batchrun.engines.vllm.errors import BadRequest
from batchrun.openai.params import EmbeddingParams, embedding_params
from batchrun.openai.records import Outcome, Request
from batchrun.openai.response_bodies import embedding_success


@dataclass
class EmbeddingWork:
    """An embeddings request inside vLLM: one (token ids, PoolingParams) input per item."""

    inputs: list[tuple[Any, Any]]
    prompt_tokens: int
    what: str = "embedding"  # what vLLM failed, for the message of a failed part

    def outcome(
        self, request: Request, outputs: list[Any], *, model: str, latency_s: float
    ) -> Outcome:
        """The request's answer, from its inputs' pooled vectors in order."""
        # As float32 bytes, never Python floats: a float16 or bfloat16 model's values widen
        # exactly, and the bytes go to the journal as they are (openai/vectors.py).
        vectors = [float32_le(data) for data in outputs]
        return embedding_success(
            request, vectors, model=model, prompt_tokens=self.prompt_tokens, latency_s=latency_s
        )


def float32_le(data: Any) -> bytes:
    """A pooled tensor's values as little-endian float32 bytes."""
    values = data.detach().to("cpu").float().contiguous().numpy()
    if sys.byteorder == "big":
        values = values.byteswap()
    return bytes(values.tobytes())


def embedding_work(
    tokenizer: Any,
    request: Request,
    *,
    max_model_len: int,
    vocab_size: int,
    embedding_size: int,
    matryoshka: bool,
    model_name: str,
) -> EmbeddingWork:
    """An embeddings request's vLLM inputs (each item one pooling request); raises BadRequest."""
    from vllm.pooling_params import PoolingParams

    fields = embedding_params(request)
    prompts = embedding_prompts(
        tokenizer, fields, max_model_len=max_model_len, vocab_size=vocab_size
    )
    dimensions = embedding_dimensions(
        fields.dimensions,
        embedding_size=embedding_size,
        matryoshka=matryoshka,
        model_name=model_name,
    )
    params = PoolingParams(task="embed", dimensions=dimensions)
    return EmbeddingWork([(ids, params) for ids in prompts], sum(len(p) for p in prompts))


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
