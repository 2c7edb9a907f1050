"""Whether vLLM runs on a GPU here, as vLLM itself decides: never by asking torch.cuda.

`torch.cuda.is_available()` initialises the CUDA driver in the calling process; vLLM then keeps
`fork` for its tensor-parallel ranks (it switches to spawn only when torch's own CUDA state is
initialised), and the forked ranks fail with "CUDA error: initialization error". vLLM's
`current_platform` decides from NVML and the build installed, without touching CUDA.
"""

from __future__ import annotations


def on_cuda() -> bool:
    """True when vLLM's platform is a GPU (CUDA, or ROCm's CUDA-alike); imports vLLM."""
    from vllm.platforms import current_platform

    return bool(current_platform.is_cuda_alike())
