"""LoRA adapters for the packaged SmolLM2 model, written directly (adapter_config.json and
adapter_model.safetensors, as peft saves them) with random weights under a fixed seed: no peft,
no download. A scale large enough that answers differ from the base model's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# The raw engine's KV cache: as batchrun's test engines' (conftest.TEST_KV_CACHE_BYTES).
RAW_KV_CACHE_BYTES = 1 << 30

# SmolLM2-135M-Instruct's shapes (its config.json): hidden 576, 30 layers, 9 heads and 3 KV
# heads of 64.
HIDDEN = 576
LAYERS = 30
KV_OUT = 3 * 64
RANK = 8


def make_adapter(
    directory: Path,
    seed: int,
    *,
    rank: int = RANK,
    scale: float = 0.3,
    base: str = "SmolLM2-135M-Instruct",
    hidden: int = HIDDEN,
) -> Path:
    """Write a rank-`rank` LoRA adapter on q_proj and v_proj of every layer into `directory`
    (`hidden`: another model's hidden size, for an adapter that does not fit SmolLM2)."""
    import torch
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for layer in range(LAYERS):
        for module, out in (("q_proj", hidden), ("v_proj", KV_OUT)):
            key = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            tensors[f"{key}.lora_A.weight"] = (
                torch.randn(rank, hidden, generator=generator) * scale
            ).contiguous()
            tensors[f"{key}.lora_B.weight"] = (
                torch.randn(out, rank, generator=generator) * scale
            ).contiguous()
    save_file(tensors, str(directory / "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base,
        "r": rank,
        "lora_alpha": rank,
        "lora_dropout": 0.0,
        "bias": "none",
        "target_modules": ["q_proj", "v_proj"],
        "fan_in_fan_out": False,
        "modules_to_save": None,
        "use_rslora": False,
        "use_dora": False,
    }
    (directory / "adapter_config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    return directory


def raw_answers(model: str, adapters: dict[str, str], work: dict[str, list[str]]) -> dict[str, Any]:
    """Raw vLLM's greedy chat answers (`LLM.chat`, float32, 12 tokens): `work` maps "" (the base
    model) or an adapter's name to its prompts. Each group is one call of its own, so that base
    and adapter requests never share a batch (vLLM's CPU bug: lora.py in batchrun's engine)."""
    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest

    llm = LLM(
        model=model,
        dtype="float32",
        enforce_eager=True,
        gpu_memory_utilization=0.4,
        kv_cache_memory_bytes=RAW_KV_CACHE_BYTES,
        max_model_len=2048,
        seed=0,
        enable_lora=True,
        max_loras=len(adapters) + 1,
        max_lora_rank=RANK,
    )
    params = SamplingParams(temperature=0, max_tokens=12)
    ids = {name: i for i, name in enumerate(adapters, start=1)}
    answers: dict[str, Any] = {}
    for name, prompts in work.items():
        lora = LoRARequest(name, ids[name], adapters[name]) if name else None
        conversations: list[Any] = [[{"role": "user", "content": p}] for p in prompts]
        outputs = llm.chat(conversations, params, lora_request=lora)
        answers[name] = [o.outputs[0].text for o in outputs]
    return answers


if __name__ == "__main__":
    # python scripts/testmodels/lora.py MODEL ADAPTERS_JSON WORK_JSON: the raw answers as JSON on stdout.
    import sys

    if len(sys.argv) != 4 or sys.argv[1].startswith("-"):
        help_asked = sys.argv[1:2] in (["-h"], ["--help"])
        print(
            "usage: python scripts/testmodels/lora.py MODEL ADAPTERS_JSON WORK_JSON\n"
            "Prints the raw answers vLLM gives with each adapter, as RAW <json>.",
            file=sys.stdout if help_asked else sys.stderr,
        )
        sys.exit(0 if help_asked else 2)
    result = raw_answers(sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3]))
    print("RAW " + json.dumps(result))
