"""batchrun's engine settings as vLLM's `EngineArgs`: the one place they are translated.

vLLM and torch are imported at use: call this only where the engine is about to start (after
VLLM_ENABLE_V1_MULTIPROCESSING is decided; see engine.py). Whether it runs on a GPU is vLLM's
own decision (platform.py), never torch.cuda's.
"""

from __future__ import annotations

from typing import Any

from batchrun.config import EngineSettings
from batchrun.engines.vllm.dtype import resolve_dtype
from batchrun.engines.vllm.params import capped_max_model_len
from batchrun.engines.vllm.platform import on_cuda
from batchrun.engines.vllm.reasoning import check_parser_name
from batchrun.models import EngineModel
from batchrun.openai.records import POOLING_ENDPOINTS

# On the CPU backend `gpu_memory_utilization` is the fraction of host memory vLLM reserves, and
# vLLM's default (0.92) is refused at start-up on a machine that runs anything else.
CPU_MEMORY_UTILIZATION = 0.4


def engine_args(settings: EngineSettings, target: EngineModel, model_name: str) -> Any:
    """vLLM's EngineArgs that load `target` as `settings` ask, answering as `model_name`."""
    from vllm import EngineArgs

    cuda = on_cuda()
    memory_utilization = settings.gpu_memory_utilization
    if memory_utilization is None and not cuda:
        memory_utilization = CPU_MEMORY_UTILIZATION
    extra: dict[str, Any] = {}
    if memory_utilization is not None:
        extra["gpu_memory_utilization"] = memory_utilization
    # An embeddings, score or rerank job runs the model as a pooling model (vLLM converts a
    # generative one); otherwise vLLM picks the runner from the architecture.
    if settings.endpoint in POOLING_ENDPOINTS:
        extra["runner"] = "pooling"
    if settings.reasoning_parser is not None:
        check_parser_name(settings.reasoning_parser)  # before the engine's 20 s start
        # As `vllm serve --reasoning-parser`: the engine then holds a response_format's
        # constraint back until the reasoning has ended.
        extra["reasoning_parser"] = settings.reasoning_parser

    model_args: dict[str, Any] = {
        "model": target.model,
        "tokenizer": target.tokenizer,
        "revision": target.revision,
        "served_model_name": model_name,
    }
    # EngineArgs types dtype as a Literal; the value is validated by vLLM itself.
    dtype: Any = resolve_dtype(settings.dtype, cuda=cuda)
    if settings.max_model_len is not None:
        extra["max_model_len"] = capped_max_model_len(
            EngineArgs(**model_args, dtype=dtype, **extra), settings.max_model_len
        )
    return EngineArgs(
        **model_args,
        dtype=dtype,
        tensor_parallel_size=settings.tensor_parallel_size,
        # Unset: eager on the CPU backend, where compiling costs more start-up than it saves.
        enforce_eager=settings.enforce_eager if settings.enforce_eager is not None else not cuda,
        seed=settings.seed,
        max_num_seqs=settings.max_num_seqs,
        # On: vLLM counts prefix-cache hits only then (its periodic log lines stay off: see
        # cache.py). None: vLLM sizes the KV cache from the memory fraction.
        disable_log_stats=False,
        kv_cache_memory_bytes=settings.kv_cache_memory_bytes,
        **extra,
    )
