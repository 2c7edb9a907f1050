"""Time to first token, as vLLM reports it on a finished RequestOutput (its `metrics`, kept when
the engine logs stats, as batchrun's does: engines/vllm/args.py)."""

from __future__ import annotations

from typing import Any


def first_token_s(output: Any) -> float | None:
    """Seconds from the request's arrival in the engine to its first token; None when vLLM did
    not measure it (stats off, a pooling request, a request that never ran)."""
    metrics = getattr(output, "metrics", None)
    value = getattr(metrics, "first_token_latency", None)
    if isinstance(value, int | float) and value > 0:
        return float(value)
    return None
