"""What a closed in-process vLLM engine leaves behind, freed so that a new one can start."""

from __future__ import annotations

import gc
from typing import Any


def release_vllm_globals() -> None:
    """Free what a closed in-process engine leaves behind, so that a new one can start."""
    try:
        from vllm.distributed import parallel_state

        destroy: Any
        for destroy in (
            parallel_state.destroy_model_parallel,
            parallel_state.destroy_distributed_environment,
        ):
            destroy()
    except Exception:  # best effort: the process usually exits right after close()
        pass
    gc.collect()
    import torch

    # Only where this process used CUDA: is_available would initialise the driver here.
    if torch.cuda.is_initialized():  # type: ignore[no-untyped-call]  # untyped there
        torch.cuda.empty_cache()
