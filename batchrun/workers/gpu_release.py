"""Before a worker starts again on its GPUs, wait until the memory its last engine held is free.

A killed process's GPU memory is given back by the driver after the process is gone, not at
once; an engine started meanwhile sees the GPU still full and fails ("Free memory on device ...
is less than desired GPU memory utilization"). NVML (`nvidia-ml-py`, through gpu_memory.py) says
how much is in use; the wait ends when each GPU is back to what it held before this process
first started an engine there, or after a bound (another process may have taken memory
meanwhile: the engine's own start then says so). Without NVML there is nothing to read, and no
wait.
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
# MiB in use on each GPU (by its CUDA_VISIBLE_DEVICES entry) before this process first started an
# engine there: what it waits to see again before another engine starts there (a restarted
# worker, or a new pool of them under serve).
_BASELINES: dict[str, float] = {}


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


def wait_for_gpus(
    env: Mapping[str, str], timeout: float = GPU_FREE_TIMEOUT_S, read: Reader | None = None
) -> bool:
    """Before a worker starts on the GPUs of `env`: where this process ran an engine before,
    wait until each holds no more than it did before the first one started there (plus
    SLACK_MIB), up to `timeout` seconds; the first start on a GPU records that. True when the
    memory is back (or there is nothing to wait for)."""
    used = memory_in_use(env, read)
    devices = gpu_entries(env)
    if used is None or len(used) != len(devices):
        return True  # a CPU worker, or NVML cannot tell: nothing to wait for
    used_before = any(d in _BASELINES for d in devices)
    for device, mib in zip(devices, used, strict=True):
        _BASELINES.setdefault(device, mib)
    if not used_before:
        return True
    baseline = [_BASELINES[d] for d in devices]
    deadline = time.monotonic() + timeout
    while not all(u <= b + SLACK_MIB for u, b in zip(used, baseline, strict=True)):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.25)
        now = memory_in_use(env, read)
        if now is None or len(now) != len(baseline):
            return True  # NVML cannot tell any more: nothing to wait for
        used = now
    return True


def _nvml_reader() -> Reader:
    from batchrun.workers.gpu_memory import gpu_memory_mb

    return gpu_memory_mb
