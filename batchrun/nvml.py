"""NVML (`nvidia-ml-py`, module `pynvml`), opened for one reading of the GPUs: none where it is not
installed or no driver loads; a device named as CUDA_VISIBLE_DEVICES names it. Read by the parent
for /metrics (metrics/gpu.py) and by a worker for its peak memory (workers/gpu_memory.py): NVML
needs no CUDA context."""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def opened() -> Iterator[Any | None]:
    """`pynvml`, initialized for the block and shut down after it; None when it cannot be (not
    installed, no driver, a library that does not load)."""
    try:
        pynvml = importlib.import_module("pynvml")  # optional, and untyped
    except ImportError:
        yield None
        return
    try:
        pynvml.nvmlInit()
    except Exception:  # no driver, or a library that does not load
        yield None
        return
    try:
        yield pynvml
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def device_handle(pynvml: Any, device: str) -> Any:
    """NVML's handle of a CUDA_VISIBLE_DEVICES entry: an index (NVML's, which is CUDA's with
    CUDA_DEVICE_ORDER=PCI_BUS_ID), or a GPU-/MIG- UUID. Raises what NVML raises for a device it
    does not know."""
    if device.startswith(("GPU-", "MIG-")):
        return pynvml.nvmlDeviceGetHandleByUUID(device)
    return pynvml.nvmlDeviceGetHandleByIndex(int(device))
