"""Recognise out-of-memory failures, so that the scheduler restarts a worker with a smaller batch.

vLLM reports running out of memory in several shapes: PyTorch's `torch.cuda.OutOfMemoryError`
during a forward pass, and plain exceptions (ValueError, RuntimeError) at start-up when the KV cache
does not fit, on CUDA and on the CPU backend alike. Often the exception the worker catches wraps
the original one (`raise ... from exc`, or an error raised while handling another), so the whole
`__cause__` / `__context__` chain is examined. Matching is by type name and message text, so this
module never imports torch.
"""

from __future__ import annotations

# torch.OutOfMemoryError (also reachable as torch.cuda.OutOfMemoryError) and Python's own.
_OOM_TYPE_NAMES = frozenset({"OutOfMemoryError", "MemoryError"})

# Lower-case fragments of the messages that PyTorch and vLLM use for memory exhaustion.
_OOM_FRAGMENTS = (
    "cuda out of memory",
    # The CUDA runtime's own error string (cudaErrorMemoryAllocation), and cuBLAS failing to get
    # its workspace: both are the device running out, raised as plain RuntimeErrors.
    "cuda error: out of memory",
    "cublas_status_alloc_failed",
    # vLLM, when the memory left after loading the weights holds no KV cache block at all.
    "no available memory for the cache blocks",
    # vLLM, when max_model_len tokens of one sequence do not fit in the KV cache (older wording,
    # then the wording of vLLM 0.32).
    "larger than the maximum number of tokens that can be stored in kv cache",
    "kv cache is needed, which is larger than the available kv cache memory",
    # vLLM on CUDA, when gpu_memory_utilization asks for more than the device has free:
    # "Free memory on device cuda:0 (.../79.2 GiB) on startup is less than desired GPU memory
    # utilization (0.9, 71.3 GiB)".
    "free memory on device",
    "is less than desired",
    # PyTorch's CPU allocator: "DefaultCPUAllocator: can't allocate memory: you tried to ...".
    "can't allocate memory",
)

# Fragments that count only together, being too common apart.
_OOM_FRAGMENT_PAIRS = (
    # vLLM's CPU backend: "Available memory on node 0 (.../23.4 GiB) on startup is less than
    # desired CPU memory utilization (0.92, 21.5 GiB)", and the same at KV cache allocation.
    ("available memory on node", "less than desired cpu memory utilization"),
    ("available memory on node", "less than requested memory for kv"),
)

# A cycle in the chain cannot happen with ordinary raises, but a bound keeps a pathological one
# from looping forever.
_MAX_CHAIN = 64


# vLLM's start-up failures when its KV cache cannot hold what it must: not one block, or not one
# sequence of max_model_len tokens. With a KV budget fixed in bytes (--kv-cache-memory-bytes),
# no smaller batch changes either: the budget itself is too small.
_KV_TOO_SMALL = (
    "no available memory for the cache blocks",
    "larger than the maximum number of tokens that can be stored in kv cache",
    "kv cache is needed, which is larger than the available kv cache memory",
)


def kv_cache_too_small(message: str) -> bool:
    """Whether a start-up failure's message says the KV cache cannot hold one block or one
    sequence (out of memory, but of the KV cache's size, not of the batch's)."""
    lowered = message.lower()
    return any(fragment in lowered for fragment in _KV_TOO_SMALL)


def is_oom(exc: BaseException) -> bool:
    """Whether `exc`, or any exception it was raised from or during, means out of memory."""
    seen: set[int] = set()
    pending: list[BaseException] = [exc]
    while pending and len(seen) < _MAX_CHAIN:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if _is_oom_one(current):
            return True
        for linked in (current.__cause__, current.__context__):
            if linked is not None:
                pending.append(linked)
    return False


def _is_oom_one(exc: BaseException) -> bool:
    """Whether this one exception (not its chain) means out of memory."""
    if any(cls.__name__ in _OOM_TYPE_NAMES for cls in type(exc).__mro__):
        return True
    try:
        message = str(exc)
    except Exception:  # a broken __str__ must not turn classification into a crash
        return False
    return is_oom_message("", message)


def is_oom_message(type_name: str, message: str) -> bool:
    """Whether an exception known only by its text (a line of another process's traceback:
    `torch.OutOfMemoryError: CUDA out of memory ...`) means out of memory."""
    if type_name.rsplit(".", 1)[-1] in _OOM_TYPE_NAMES:
        return True
    lowered = message.lower()
    if any(fragment in lowered for fragment in _OOM_FRAGMENTS):
        return True
    return any(all(part in lowered for part in pair) for pair in _OOM_FRAGMENT_PAIRS)
