"""LoRA adapters for the packaged SmolLM2 model, written directly (adapter_config.json and
adapter_model.safetensors, as peft saves them) with random weights under a fixed seed: no peft,
no download. A scale large enough that answers differ from the base model's."""

from __future__ import annotations

import json
from pathlib import Path

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
) -> Path:
    """Write a rank-`rank` LoRA adapter on q_proj and v_proj of every layer into `directory`."""
    import torch
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for layer in range(LAYERS):
        for module, out in (("q_proj", HIDDEN), ("v_proj", KV_OUT)):
            key = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            tensors[f"{key}.lora_A.weight"] = (
                torch.randn(rank, HIDDEN, generator=generator) * scale
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
