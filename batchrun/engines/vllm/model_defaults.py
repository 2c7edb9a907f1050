"""A model's own sampling defaults (its generation_config.json: temperature, top_p, top_k, ...) for
the fields a request leaves unset, as vLLM's server and `vllm run-batch` apply them.

Model authors ship the settings their model is meant to sample with (Qwen2.5-Instruct: temperature
0.7, top_p 0.8, top_k 20, repetition_penalty 1.05). vLLM's server puts them under every request
that does not say otherwise ("Default sampling parameters have been overridden by the model's
generation config"); a job moved from it to batchrun must get the same answers. A field the
request sets, null aside, is the request's. A model without such defaults (the embedded one)
samples with OpenAI's, as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from batchrun.openai.params import Sampling
from batchrun.openai.vllm_sampling import VllmSampling

# Which of vLLM's defaults (ModelConfig.get_diff_sampling_param) land on which typed field.
_OPENAI_FIELDS = {
    "temperature": float,
    "top_p": float,
    "presence_penalty": float,
    "frequency_penalty": float,
}
_VLLM_FIELDS = {"top_k": int, "min_p": float, "repetition_penalty": float}


def model_defaults(model_config: Any) -> dict[str, Any]:
    """The sampling defaults of the model's generation config that vLLM applies (empty: none)."""
    wanted = {*_OPENAI_FIELDS, *_VLLM_FIELDS, "max_tokens"}
    found = model_config.get_diff_sampling_param()
    return {k: v for k, v in found.items() if k in wanted and v is not None}


def with_model_defaults(
    params: Sampling, body: Mapping[str, Any], defaults: Mapping[str, Any]
) -> Sampling:
    """`params` with `defaults` in the fields `body` leaves unset (a max_tokens default is
    applied against the context window: engines/vllm/params.sampling_params)."""
    if not defaults:
        return params
    openai: dict[str, Any] = {
        k: kind(defaults[k]) for k, kind in _OPENAI_FIELDS.items() if _unset(k, body, defaults)
    }
    vllm = {k: kind(defaults[k]) for k, kind in _VLLM_FIELDS.items() if _unset(k, body, defaults)}
    if vllm:
        openai["vllm"] = msgspec.structs.replace(params.vllm or VllmSampling(), **vllm)
    return msgspec.structs.replace(params, **openai) if openai else params


def _unset(key: str, body: Mapping[str, Any], defaults: Mapping[str, Any]) -> bool:
    return key in defaults and body.get(key) is None


def sampling_defaults_line(defaults: Mapping[str, Any]) -> str:
    """The job's line naming the model's defaults: "... temperature 0.7, top_p 0.8"."""
    named = ", ".join(
        f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}" for k, v in defaults.items()
    )
    return (
        "the model's generation config sets what a request leaves unset, as vLLM's server "
        f"does: {named}"
    )
