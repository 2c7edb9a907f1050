"""A CPU engine's KV cache on fresh zero pages, faulted in as it is used.

vLLM allocates the whole KV cache at start as one `torch.zeros` buffer (`allocate_kv_cache` in
vllm/v1/worker/utils.py). On a GPU that is a memset at device speed. On a CPU it writes every
page of a cache sized to a share of the machine's memory (8.2 GiB of a 24 GiB machine), and the
kernel faults each 4 KiB page in first: 3-11 s of the engine's start on 2 cores, 45% of its
samples, for a cache most jobs fill a fraction of. An anonymous mapping is zeros by the kernel's
guarantee, so the same buffer taken from a fresh one holds the same bytes, and its pages are
faulted in when a block is first written instead. Nothing else changes: vLLM sizes the cache,
views it and zeroes the blocks it hands out as before.

Applied only to CPU devices, and only where vLLM has the function and its module's `torch` as
this version does; otherwise vLLM allocates as it always has.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable
from typing import Any


class _FreshZeros:
    """`torch` as vLLM's KV-cache module sees it during the allocation: `zeros` of a flat CPU
    buffer comes from a fresh anonymous mapping; everything else is torch's own."""

    def __init__(self, torch: Any) -> None:
        self._torch = torch

    def __getattr__(self, name: str) -> Any:
        return getattr(self._torch, name)

    def zeros(self, *size: Any, **kwargs: Any) -> Any:
        """A flat CPU buffer of zeros on fresh pages; any other shape or device as torch makes it."""
        torch = self._torch
        dtype = kwargs.get("dtype") or torch.get_default_dtype()
        device = torch.device(kwargs.get("device") or "cpu")
        flat = len(size) == 1 and isinstance(size[0], int) and size[0] > 0
        if not flat or device.type != "cpu" or set(kwargs) - {"dtype", "device"}:
            return torch.zeros(*size, **kwargs)
        count = size[0]
        mapping = mmap.mmap(-1, count * torch.empty((), dtype=dtype).element_size())
        # The tensor holds a reference to the mapping: it is unmapped when the cache is freed.
        return torch.frombuffer(mapping, dtype=dtype, count=count)


def fresh_kv_cache(original: Callable[..., Any], module: Any) -> Callable[..., Any]:
    """`original` (vLLM's `allocate_kv_cache`, defined in `module`) with its CPU buffer taken
    from fresh pages: `module.torch` is swapped for the call only (the engine core builds its
    cache on one thread, before any step)."""
    import torch

    shim = _FreshZeros(torch)

    def allocate(kv_cache_config: Any, device: Any, *args: Any, **kwargs: Any) -> Any:
        if torch.device(device).type != "cpu" or module.torch is not torch:
            return original(kv_cache_config, device, *args, **kwargs)
        module.torch = shim
        try:
            return original(kv_cache_config, device, *args, **kwargs)
        finally:
            module.torch = torch

    allocate.__wrapped__ = original  # type: ignore[attr-defined]
    return allocate


def install() -> bool:
    """Make vLLM's model runner allocate a CPU KV cache on fresh pages; whether it could (this
    vLLM has the function where this module expects it). Installing twice changes nothing."""
    try:
        from vllm.v1.worker import gpu_model_runner, utils
    except ImportError:
        return False
    current = getattr(gpu_model_runner, "allocate_kv_cache", None)
    if getattr(current, "__wrapped__", None) is not None:
        return True  # already installed
    if current is None or getattr(utils, "torch", None) is None:
        return False
    original: Callable[..., Any] = current
    if original is not getattr(utils, "allocate_kv_cache", None):
        return False  # not where this module expects it: vLLM allocates as it always has
    setattr(gpu_model_runner, "allocate_kv_cache", fresh_kv_cache(original, utils))  # noqa: B010
    return True
