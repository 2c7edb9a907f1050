"""Out-of-memory classification: the messages and types that PyTorch and vLLM really produce."""

from __future__ import annotations

import pytest

from batchrun.engines.oom import is_oom


class OutOfMemoryError(RuntimeError):
    """Stands in for torch.cuda.OutOfMemoryError (matched by name; torch is not imported)."""


class OutOfMemoryErrorSubclass(OutOfMemoryError):
    """A subclass of an OOM type is still an OOM."""


def _chained(outer: BaseException, inner: BaseException, *, explicit: bool) -> BaseException:
    """Raise `outer` while handling `inner` (explicitly `from` it, or implicitly) and return it."""
    try:
        try:
            raise inner
        except BaseException as exc:
            if explicit:
                raise outer from exc
            raise outer  # noqa: B904 -- the implicit __context__ chain is the point
    except BaseException as caught:
        return caught
    raise AssertionError("unreachable")


@pytest.mark.parametrize(
    "exc",
    [
        OutOfMemoryError("whatever the message"),
        OutOfMemoryErrorSubclass("x"),
        MemoryError(),
        RuntimeError(
            "CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of "
            "79.19 GiB of which 3.12 GiB is free."
        ),
        RuntimeError("cuda OUT OF MEMORY"),
        ValueError(
            "No available memory for the cache blocks. Try increasing `gpu_memory_utilization` "
            "when initializing the engine."
        ),
        ValueError(
            "The model's max seq len (32768) is larger than the maximum number of tokens that "
            "can be stored in KV cache (16000). Try increasing `gpu_memory_utilization`."
        ),
        ValueError(
            "To serve at least one request with the model's max seq len (131072), (16.0 GiB KV "
            "cache is needed, which is larger than the available KV cache memory (2.1 GiB)."
        ),
        ValueError(
            "Free memory on device cuda:0 (10.5/79.19 GiB) on startup is less than desired GPU "
            "memory utilization (0.9, 71.27 GiB). Decrease GPU memory utilization."
        ),
        ValueError(
            "Available memory on node 0 (11.2/23.4 GiB) on startup is less than desired CPU "
            "memory utilization (0.92, 21.5 GiB). On the CPU backend, ..."
        ),
        ValueError(
            "Available memory on node 0 (1.2/23.4 GiB) on kv cache allocation is less than "
            "requested memory for kv (3.0/9.3 GiB). Reduce CPU memory used by other processes."
        ),
        RuntimeError(
            "[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate "
            "memory: you tried to allocate 4294967296 bytes."
        ),
    ],
)
def test_oom_recognised(exc: BaseException) -> None:
    assert is_oom(exc)


@pytest.mark.parametrize(
    "exc",
    [
        RuntimeError("Engine core initialization failed. See root cause above."),
        ValueError("max_tokens must be at least 1, got 0."),
        KeyError("out"),
        TimeoutError("memory"),
        RuntimeError("CUDA error: device-side assert triggered"),
        ValueError("Available memory on node 0 is fine"),
        OSError("No space left on device"),
        KeyboardInterrupt(),
    ],
)
def test_other_failures_are_not_oom(exc: BaseException) -> None:
    assert not is_oom(exc)


@pytest.mark.parametrize("explicit", [True, False])
def test_oom_found_through_the_chain(explicit: bool) -> None:
    inner = OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB")
    outer = _chained(RuntimeError("Engine core initialization failed"), inner, explicit=explicit)
    assert is_oom(outer)


def test_oom_found_deep_in_the_chain() -> None:
    middle = _chained(RuntimeError("worker failed"), MemoryError(), explicit=True)
    outer = _chained(RuntimeError("engine dead"), middle, explicit=False)
    assert is_oom(outer)


def test_chain_without_oom_is_not_oom() -> None:
    outer = _chained(RuntimeError("engine dead"), ValueError("bad config"), explicit=True)
    assert not is_oom(outer)


def test_cyclic_chain_terminates() -> None:
    a = RuntimeError("a")
    b = RuntimeError("b")
    a.__cause__ = b
    b.__cause__ = a
    assert not is_oom(a)


def test_broken_str_is_not_a_crash() -> None:
    class Weird(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no str for you")

    assert not is_oom(Weird())


def test_cuda_runtime_and_cublas_allocation_failures_are_oom() -> None:
    assert is_oom(
        RuntimeError(
            "CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported"
        )
    )
    assert is_oom(
        RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`")
    )
    assert not is_oom(RuntimeError("CUDA error: device-side assert triggered"))
