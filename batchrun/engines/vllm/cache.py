"""vLLM's prefix-cache counters, read from vLLM itself.

Each engine step, vLLM's scheduler reports how many prompt tokens it looked up in the prefix
cache and how many it found there (`SchedulerStats.prefix_cache_stats`: the numbers behind its
`vllm:prefix_cache_queries` / `vllm:prefix_cache_hits` metrics). They reach the stat loggers an
`LLMEngine` is given; `PrefixCacheCounter` is one, summing them. vLLM only makes these stats
with stat logging on (`disable_log_stats=False`); its periodic log lines stay off, as its
logger is set to errors only in a worker (workers/child.py).
"""

from __future__ import annotations

from typing import Any


class PrefixCacheCounter:
    """The prompt tokens vLLM looked up in its prefix cache, and found there, since it started."""

    def __init__(self) -> None:
        self.queries = 0
        self.hits = 0

    def counters(self) -> tuple[int, int]:
        """(tokens looked up, tokens found cached) so far."""
        return self.queries, self.hits

    def reset(self) -> None:
        """Start counting again from zero (after a warm-up that no line asked for)."""
        self.queries = 0
        self.hits = 0

    def factory(self) -> Any:
        """A stat-logger factory for `LLMEngine.from_engine_args(stat_loggers=[...])` whose
        loggers add into this counter (vLLM's own class, imported only here)."""
        from vllm.v1.metrics.loggers import StatLoggerBase

        counter = self

        class _Logger(StatLoggerBase):
            def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
                pass

            def record(
                self,
                scheduler_stats: Any,
                iteration_stats: Any,
                mm_cache_stats: Any = None,
                engine_idx: int = 0,
            ) -> None:
                stats = getattr(scheduler_stats, "prefix_cache_stats", None)
                if stats is not None:
                    counter.queries += int(stats.queries)
                    counter.hits += int(stats.hits)

            def log_engine_initialized(self) -> None:
                pass

        return _Logger
