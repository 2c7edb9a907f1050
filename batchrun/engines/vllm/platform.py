"""Whether vLLM runs on a GPU here, as vLLM itself decides: never by asking torch.cuda.

`torch.cuda.is_available()` initialises the CUDA driver in the calling process (unless
PYTORCH_NVML_BASED_CUDA_CHECK=1), and vLLM then starts its tensor-parallel ranks with `fork`
(it switches to spawn only when torch's own CUDA state is initialised): the forked ranks fail
with "CUDA error: initialization error". It also answers for the torch installed, not for the
vLLM build. vLLM's `current_platform` decides from the build and NVML, without touching CUDA.
"""

from __future__ import annotations


def on_cuda() -> bool:
    """True when vLLM's platform is a GPU (CUDA, or ROCm's CUDA-alike); imports vLLM."""
    from vllm.platforms import current_platform

    return bool(current_platform.is_cuda_alike())
