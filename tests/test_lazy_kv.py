"""A CPU engine's KV cache on fresh zero pages (engines/vllm/lazy_kv.py): the buffer vLLM asks
for holds zeros, costs no resident memory until written, and anything but a flat CPU buffer is
torch's own; installed on the vLLM this project runs, where its CPU model runner looks it up."""

from __future__ import annotations

import types
from typing import Any

import pytest
import torch

from batchrun.engines.vllm import lazy_kv

MIB = 2**20


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def _module_allocating(size: int) -> types.ModuleType:
    """A module shaped like vLLM's KV-cache one: an `allocate_kv_cache` that takes its buffer
    with the module's own `torch.zeros`."""
    module = types.ModuleType("kv_module")
    module.torch = torch  # type: ignore[attr-defined]

    def allocate_kv_cache(config: Any, device: Any, *rest: Any) -> Any:
        return module.torch.zeros(size, dtype=torch.int8, device=device)

    module.allocate_kv_cache = allocate_kv_cache  # type: ignore[attr-defined]
    return module


def test_the_cpu_buffer_is_zeros_and_takes_no_memory_until_written() -> None:
    size = 512 * MIB
    module = _module_allocating(size)
    allocate = lazy_kv.fresh_kv_cache(module.allocate_kv_cache, module)
    before = _rss_kib()
    buf = allocate(None, torch.device("cpu"))
    grown = _rss_kib() - before
    assert buf.dtype == torch.int8 and buf.numel() == size and buf.device.type == "cpu"
    assert grown < 32 * 1024, grown  # KiB: none of the 512 MiB is resident yet
    assert module.torch is torch  # swapped for the call only
    # Zeros where read, and written where written: a block in the middle faults in alone.
    assert int(buf[:4096].abs().sum()) == 0 and int(buf[-4096:].abs().sum()) == 0
    buf[size // 2 : size // 2 + 8 * MIB] = 7
    assert int(buf[size // 2 : size // 2 + 8 * MIB].sum()) == 7 * 8 * MIB
    assert _rss_kib() - before < 64 * 1024
    # The same buffer from torch itself is written whole: resident at once.
    del buf
    plain = module.allocate_kv_cache(None, torch.device("cpu"))
    assert _rss_kib() - before > 256 * 1024, plain.numel()


@pytest.mark.parametrize(
    ("size", "kwargs"),
    [
        ((4, 4), {"dtype": torch.int8}),  # not flat
        ((16,), {"dtype": torch.int8, "device": "meta"}),  # not a CPU buffer
        ((16,), {"dtype": torch.float32, "requires_grad": True}),  # an option it does not take
    ],
)
def test_anything_but_a_flat_cpu_buffer_is_torchs_own(size: tuple[int, ...], kwargs: Any) -> None:
    shim = lazy_kv._FreshZeros(torch)
    made = shim.zeros(*size, **kwargs)
    want = torch.zeros(*size, **kwargs)
    assert (made.shape, made.dtype, made.device, made.requires_grad) == (
        want.shape,
        want.dtype,
        want.device,
        want.requires_grad,
    )
    assert shim.int8 is torch.int8  # the rest of torch, as it is


def test_a_gpu_device_is_left_to_vllm() -> None:
    calls: list[Any] = []
    module = types.ModuleType("kv_module")
    module.torch = torch  # type: ignore[attr-defined]

    def allocate_kv_cache(config: Any, device: Any) -> Any:
        calls.append(module.torch)
        return None

    allocate = lazy_kv.fresh_kv_cache(allocate_kv_cache, module)
    allocate(None, torch.device("cuda", 0))
    allocate(None, "cpu")
    assert calls[0] is torch and isinstance(calls[1], lazy_kv._FreshZeros)


def test_installed_where_vllms_cpu_model_runner_finds_it() -> None:
    """On the vLLM installed: the runner's `allocate_kv_cache` (the name its KV-cache set-up
    calls, inherited by the CPU runner) becomes the fresh-pages one, over vLLM's own; a second
    install changes nothing."""
    from vllm.v1.worker import cpu_model_runner, gpu_model_runner, utils

    original = gpu_model_runner.allocate_kv_cache  # type: ignore[attr-defined]
    try:
        assert lazy_kv.install()
        installed = gpu_model_runner.allocate_kv_cache  # type: ignore[attr-defined]
        assert installed is not original and installed.__wrapped__ is utils.allocate_kv_cache
        assert lazy_kv.install() and gpu_model_runner.allocate_kv_cache is installed  # type: ignore[attr-defined]
        assert issubclass(cpu_model_runner.CPUModelRunner, gpu_model_runner.GPUModelRunner)
        assert "allocate_kv_cache(" in _source(gpu_model_runner.GPUModelRunner)
        assert "torch.zeros(" in _source(utils.allocate_kv_cache)
    finally:
        gpu_model_runner.allocate_kv_cache = original  # type: ignore[attr-defined]


def _source(obj: Any) -> str:
    import inspect

    return inspect.getsource(obj)
