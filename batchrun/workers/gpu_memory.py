"""Memory in use on each of a worker's GPUs, read from NVML, for its peak-memory report.

With tensor parallelism, and with vLLM's own engine process, the model runs in processes other
than the worker's, so the worker's own CUDA allocator (or its host memory) says nothing about
what the GPUs hold. NVML does. The reading is the device's memory in use: a worker is given its
GPUs to itself (a Ray placement group, a CUDA_VISIBLE_DEVICES of its own), so that is the
worker's. NVML comes from `nvidia-ml-py` (module `pynvml`); without it, or without a driver,
there is no reading and the caller falls back to what it had.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from batchrun import nvml


def gpu_memory_mb(devices: Sequence[str]) -> list[float] | None:
    """MiB in use on each of `devices` (CUDA_VISIBLE_DEVICES entries: an ordinal, or a GPU-/MIG-
    UUID), in that order; None when NVML cannot say for every one of them.

    An ordinal is NVML's index, which is CUDA's with CUDA_DEVICE_ORDER=PCI_BUS_ID (NVML counts
    in PCI bus order).
    """
    if not devices:
        return None
    with nvml.opened() as pynvml:
        if pynvml is None:  # not installed, or no driver: no reading
            return None
        try:
            return [_used_mib(pynvml, device.strip()) for device in devices]
        except Exception:  # a device NVML does not know (gone, or a name it cannot resolve)
            return None


def _used_mib(pynvml: Any, device: str) -> float:
    handle = nvml.device_handle(pynvml, device)
    return float(pynvml.nvmlDeviceGetMemoryInfo(handle).used) / 2**20
