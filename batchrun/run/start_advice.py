"""The one line a failed engine start ends with: what vLLM said, and the option that fixes it.

Each kind of start-up failure (engines/startup.py) has its own way out, read from the figures of
vLLM's own message where it gives them: a memory fraction too small for the model asks to raise
--gpu-memory-utilization (to above what the model and the engine take), memory held by other
processes asks to free it (or to lower the fraction), a KV cache larger than the memory free asks
for a smaller one, a model larger than the device for more devices or a smaller model.
"""

from __future__ import annotations

import math

from batchrun.config import EngineSettings
from batchrun.engines.startup import MemoryFigures, StartFailure, StartKind
from batchrun.workers.holders import memory_holders


def give_up_advice(settings: EngineSettings, cause: StartFailure, said: str) -> str:
    """The line for a failure no restart cures (one whose `cause.retried` is False): a setting
    that cannot work, named with the option that fixes it."""
    kind = cause.kind
    if kind is StartKind.MAX_MODEL_LEN:
        return max_model_len_advice(settings, cause, said)
    if kind is StartKind.NO_KV_CACHE:
        return no_kv_cache_advice(settings, cause.memory, said)
    if kind is StartKind.MODEL_TOO_LARGE:
        return model_too_large_advice(settings, cause.memory, said)
    if kind is StartKind.KV_OVER_FREE and cause.memory is not None:
        return (
            f"the KV cache asked for is more than the whole memory "
            f"({cause.memory.total_gib:g} GiB) ({said}); "
            + _smaller_kv(settings, "give --kv-cache-memory-bytes less")
        )
    return f"the engine cannot start with these settings ({said})"


def free_memory_advice(
    settings: EngineSettings, cause: StartFailure, said: str, starts: int
) -> str:
    """The line for an engine that found too little memory free on every one of `starts` starts:
    other processes hold it (the fraction asked for more than was free)."""
    memory = cause.memory
    on_cpu = (memory is not None and memory.on_cpu) or "available memory on node" in said.lower()
    held = "other processes on this machine hold its memory" if on_cpu else memory_holders()
    what = "for the KV cache" if cause.kind is StartKind.KV_OVER_FREE else "to start the engine"
    if cause.kind is StartKind.KV_OVER_FREE:
        lower = _smaller_kv(settings, "lower --kv-cache-memory-bytes")
    else:
        lower = f"lower --gpu-memory-utilization{_now(settings, default=True)}"
    return (
        f"not enough free memory {what}, {starts} starts in a row ({said}); {held}. "
        f"Free that memory, or {lower}"
    )


def _smaller_kv(settings: EngineSettings, fixed: str) -> str:
    """How to ask for a smaller KV cache: in bytes when the job gives it so, else the fraction."""
    budget = settings.kv_cache_memory_bytes
    if budget is not None:
        return f"{fixed} (now {budget:,})"
    return f"lower --gpu-memory-utilization{_now(settings, default=True)}"


def _now(settings: EngineSettings, default: bool = False) -> str:
    fraction = settings.gpu_memory_utilization
    if fraction is not None:
        return f" (now {fraction:g})"
    return " (vLLM's default: 0.9 on a GPU)" if default else ""


def max_model_len_advice(settings: EngineSettings, cause: StartFailure, said: str) -> str:
    """The line for a max model length whose one sequence does not fit the KV cache."""
    given = settings.max_model_len
    what = f"--max-model-len {given}" if given is not None else "the model's own max seq len"
    more = (
        "give --kv-cache-memory-bytes more"
        if settings.kv_cache_memory_bytes is not None
        else "raise --gpu-memory-utilization"
    )
    if cause.estimate:
        fix = f"set --max-model-len {cause.estimate} or lower, or {more}"
        estimate = f"; vLLM estimates the longest that fits at {cause.estimate} tokens"
    else:
        fix, estimate = f"set a smaller --max-model-len, or {more}", ""
    return f"{what} does not fit in the KV cache ({said}){estimate}: {fix}"


def no_kv_cache_advice(settings: EngineSettings, memory: MemoryFigures | None, said: str) -> str:
    """The line for a memory fraction that leaves the KV cache nothing (a negative share)."""
    budget = settings.kv_cache_memory_bytes
    if budget is not None:
        # The KV cache's size is fixed in bytes: backing off would only start it again and again.
        return (
            f"--kv-cache-memory-bytes {budget:,} is too small for this model and "
            f"--max-model-len ({said}); give it more, or leave it out to size the KV "
            "cache from --gpu-memory-utilization"
        )
    now = _now(settings)
    engine = memory.engine_gib if memory is not None else None
    if memory is not None and engine is not None and memory.total_gib > 0:
        # vLLM gives the KV cache what the fraction's share leaves after the model and the
        # engine: a fraction at or under their share of the memory leaves it nothing.
        floor = math.ceil(engine / memory.total_gib * 100) / 100
        return (
            f"--gpu-memory-utilization{now} is below what the model and the engine take "
            f"({engine:.2f} of {memory.total_gib:g} GiB), which leaves the KV cache nothing "
            f"({said}); raise --gpu-memory-utilization above {floor:g}"
        )
    # vLLM sizes the KV cache from what the fraction leaves after the weights and its profiling
    # pass; the batch size does not enter into it, so no back-off can help.
    return (
        f"the model leaves no memory for the KV cache ({said}); raise "
        f"--gpu-memory-utilization{now}, or spread the model over more GPUs with "
        "--tensor-parallel-size"
    )


def model_too_large_advice(
    settings: EngineSettings, memory: MemoryFigures | None, said: str
) -> str:
    """The line for a model larger than the device's (or machine's) memory."""
    engine = memory.engine_gib if memory is not None else None
    if memory is not None and memory.on_cpu and engine is not None:
        return (
            f"the model and the engine take {engine:.2f} GiB, more than this machine's "
            f"{memory.total_gib:g} GiB ({said}); run a smaller model, or on a machine with more "
            "memory"
        )
    tp = settings.tensor_parallel_size
    return (
        f"the model does not fit in the GPU's memory ({said}); spread it over more GPUs with "
        f"--tensor-parallel-size (now {tp}), or run a smaller (or quantized) model"
    )
