"""The bodies of /v1/score and /v1/rerank answers: vLLM's ScoreResponse and RerankResponse.

Shaped as vLLM's server writes them (entrypoints/pooling/scoring/serving.py: `model_dump()` of its
pydantic models, null fields included), so a client of vLLM's server reads batchrun's output with
the same code; engines hand over one score per pair and the prompt tokens, the shaping is here.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from batchrun.openai.params import ScoreParams
from batchrun.openai.records import Outcome, Request
from batchrun.openai.response_bodies import answered, response_id


def scoring_success(
    request: Request,
    params: ScoreParams,
    scores: Sequence[float],
    *,
    model: str,
    prompt_tokens: int,
    latency_s: float,
) -> Outcome:
    """A successful outcome whose body is a ScoreResponse, or for rerank a RerankResponse."""
    # vLLM's ids: "score-" and a uuid's hex, for rerank too (one serving class answers both).
    rid = f"score-{response_id()}"
    body = (
        rerank_body(rid, params, scores, model=model, prompt_tokens=prompt_tokens)
        if params.rerank
        else score_body(rid, scores, model=model, prompt_tokens=prompt_tokens)
    )
    return answered(
        request,
        body,
        prompt_tokens=prompt_tokens,
        latency_s=latency_s,
    )


def score_body(
    rid: str, scores: Sequence[float], *, model: str, prompt_tokens: int
) -> dict[str, Any]:
    """A ScoreResponse: one item per pair, in the pairs' order."""
    return {
        "id": rid,
        "object": "list",
        "created": int(time.time()),
        "model": model,
        "data": [{"index": i, "object": "score", "score": float(s)} for i, s in enumerate(scores)],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "total_tokens": prompt_tokens,
            "completion_tokens": 0,
            "prompt_tokens_details": None,
            "completion_tokens_details": None,
        },
    }


def rerank_body(
    rid: str, params: ScoreParams, scores: Sequence[float], *, model: str, prompt_tokens: int
) -> dict[str, Any]:
    """A RerankResponse: the documents by score, best first (ties in input order), top_n kept."""
    # Sorted stably, as vLLM's: equal scores keep the documents' order.
    ranked = sorted(enumerate(scores), key=lambda pair: pair[1], reverse=True)
    if params.top_n is not None:
        ranked = ranked[: params.top_n]
    results = [
        {
            "index": i,
            "document": {"text": params.documents[i], "multi_modal": None},
            "relevance_score": float(s),
        }
        for i, s in ranked
    ]
    return {
        "id": rid,
        "model": model,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
        "results": results,
    }
