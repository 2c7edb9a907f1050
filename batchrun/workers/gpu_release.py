"""Before a worker starts again on its GPUs, wait until the memory its last engine held is free.

A killed process's GPU memory is given back by the driver after the process is gone, not at
once; an engine started meanwhile sees the GPU still full and fails ("Free memory on device ...
is less than desired GPU memory utilization"). NVML (`nvidia-ml-py`, through gpu_memory.py) says
how much is in use; the wait ends when each GPU is back to what it held before the worker first
started there, or after a bound (another process may have taken memory meanwhile: the engine's
own start then says so). Without NVML there is nothing to read, and no wait.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

from batchrun.workers.platform_env import worker_platform

# The most the parent waits for the memory: a driver that does not give it back in this long
# will not do so soon, and the start's own error then names what holds it.
GPU_FREE_TIMEOUT_S = 30.0
# Memory in use may settle a little above where it was (the driver's own bookkeeping).
SLACK_MIB = 512.0

Reader = Callable[[Sequence[str]], "list[float] | None"]


def gpu_entries(env: Mapping[str, str]) -> list[str]:
    """The GPUs of a worker's environment (its CUDA_VISIBLE_DEVICES entries); [] for a CPU one."""
    if worker_platform(env) != "cuda":
        return []
    return [e.strip() for e in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if e.strip()]


def memory_in_use(env: Mapping[str, str], read: Reader | None = None) -> list[float] | None:
    """MiB in use on each GPU of a worker's environment; None for a CPU worker or without NVML."""
    devices = gpu_entries(env)
    if not devices:
        return None
    return (read or _nvml_reader())(devices)


def wait_memory_released(
    env: Mapping[str, str],
    baseline: Sequence[float] | None,
    timeout: float = GPU_FREE_TIMEOUT_S,
    read: Reader | None = None,
) -> bool:
    """Wait until each GPU of `env` holds no more than `baseline` (plus SLACK_MIB), up to
    `timeout` seconds; True when it does (or when there is nothing to wait for)."""
    if baseline is None:
        return True
    deadline = time.monotonic() + timeout
    while True:
        used = memory_in_use(env, read)
        if used is None or len(used) != len(baseline):
            return True  # NVML cannot tell: nothing to wait for
        if all(u <= b + SLACK_MIB for u, b in zip(used, baseline, strict=True)):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.25)


def _nvml_reader() -> Reader:
    from batchrun.workers.gpu_memory import gpu_memory_mb

    return gpu_memory_mb
