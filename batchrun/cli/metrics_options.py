"""--metrics-port, --metrics-host, --metrics-pushgateway and --gpu-hour-cost: the options of
submit, resume and retry-failed that export a run's metrics, as their table declares them
(batchrun/options/metrics.py), given to each command by a decorator; metrics/monitoring.py
starts what they ask for."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from batchrun.options.metrics import METRICS_OPTIONS

if TYPE_CHECKING:
    from batchrun.metrics.monitoring import Monitoring


@dataclass(frozen=True)
class GivenMetrics:
    """The metrics options as given (None: left out)."""

    metrics_port: int | None
    metrics_host: str | None
    metrics_pushgateway: str | None
    gpu_hour_cost: float | None

    def monitoring(self) -> Monitoring:
        """What they ask for, not started yet (metrics/ is imported here, not with the CLI:
        prometheus_client costs `batchrun --help` ~140 ms)."""
        from batchrun.metrics.monitoring import Monitoring

        return Monitoring(
            gpu_hour_cost=self.gpu_hour_cost,
            port=self.metrics_port,
            host=self.metrics_host,
            pushgateway=self.metrics_pushgateway,
        )


def metrics_options(func: Callable[..., None]) -> Callable[..., None]:
    """Give a command the metrics options; it receives them packed, as `metrics: GivenMetrics`
    (a keyword-only parameter of its own)."""
    signature = inspect.signature(func, eval_str=True)
    own = [p for p in signature.parameters.values() if p.name != "metrics"]
    names = [o.name for o in METRICS_OPTIONS]

    @functools.wraps(func)
    def run(**kwargs: Any) -> None:
        given = GivenMetrics(**{name: kwargs.pop(name) for name in names})
        func(**kwargs, metrics=given)

    # Typer reads a command's options from its signature: these before its keyword-only ones.
    at = next((i for i, p in enumerate(own) if p.kind is p.KEYWORD_ONLY), len(own))
    added = [o.parameter(override=False) for o in METRICS_OPTIONS]
    run.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[*own[:at], *added, *own[at:]]
    )
    return run
