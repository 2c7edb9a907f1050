"""Requests into vLLM: refusing a request the loaded model cannot answer, and handing a tokenized
(or vLLM-rendered) prompt to the engine, its own input checks becoming 400s.

vLLM is imported at use only: importing this module is cheap.
"""

from __future__ import annotations

from typing import Any

from batchrun.engines.vllm.errors import BadRequest
from batchrun.openai.records import POOLING_ENDPOINTS, Request


def check_runner(request: Request, *, pooling: bool, model_name: str) -> None:
    """Refuse a request the loaded model cannot answer (an embedding model cannot chat)."""
    wants_pooling = request.url in POOLING_ENDPOINTS
    if wants_pooling and not pooling:
        raise BadRequest(
            f"{model_name} was started as a generative model, which gives no embeddings "
            f"or scores; {request.url} needs a pooling model (a job whose url is "
            f"{request.url} starts the model as one)"
        )
    if not wants_pooling and pooling:
        raise BadRequest(
            f"{model_name} runs as an embedding (pooling) model, which generates no "
            f"text; {request.url} needs a generative model"
        )


def submit(
    engine: Any, request_id: str, prompt_ids: list[int] | Any, params: Any, lora: Any = None
) -> None:
    """Hand the tokenized request (or a prompt vLLM rendered) to vLLM; its own input checks
    become 400s too."""
    from vllm.exceptions import VLLMClientError
    from vllm.inputs import TokensPrompt

    rendered = not isinstance(prompt_ids, list)
    prompt: Any = prompt_ids if rendered else TokensPrompt(prompt_token_ids=prompt_ids)
    try:
        # vLLM 0.32 deprecates raw prompts in add_request in favour of the renderer's output;
        # older versions have no renderer and take the raw prompt.
        renderer = getattr(engine, "renderer", None)
        if not rendered and renderer is not None and hasattr(renderer, "render_cmpl"):
            prompt = renderer.render_cmpl([prompt])[0]
        engine.add_request(request_id, prompt, params, lora_request=lora)
    except (ValueError, TypeError, VLLMClientError) as exc:
        raise BadRequest(str(exc)) from exc
