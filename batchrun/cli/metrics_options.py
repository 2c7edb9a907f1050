"""--metrics-port, --metrics-host and --gpu-hour-cost: the options of submit, resume and
retry-failed that export a run's metrics (batchrun/metrics), and the exporter they start."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from batchrun.metrics.exporter import Exporter
    from batchrun.metrics.recorder import RunMetrics

PANEL = "Metrics"

MetricsPort = Annotated[
    int | None,
    typer.Option(
        "--metrics-port",
        envvar="BATCHRUN_METRICS_PORT",
        help="Serve Prometheus metrics at http://HOST:PORT/metrics while the job runs (0: a free port, printed).",
        show_default=False,
        min=0,
        max=65535,
        rich_help_panel=PANEL,
    ),
]
MetricsHost = Annotated[
    str,
    typer.Option(
        "--metrics-host",
        envvar="BATCHRUN_METRICS_HOST",
        help="The address /metrics listens on.",
        rich_help_panel=PANEL,
    ),
]


def _finite_cost(value: float | None) -> float | None:
    """--gpu-hour-cost as given; nan and inf are refused (they would price a job at $nan)."""
    if value is not None and not math.isfinite(value):
        raise typer.BadParameter(f"must be a finite number of USD, got {value!r}")
    return value


GpuHourCost = Annotated[
    float | None,
    typer.Option(
        "--gpu-hour-cost",
        envvar="BATCHRUN_GPU_HOUR_COST",
        help="USD per GPU-hour (per machine-hour on a CPU): the run's cost in /metrics, status and the summary.",
        show_default=False,
        min=0.0,
        callback=_finite_cost,
        rich_help_panel=PANEL,
    ),
]


class Monitoring:
    """The run's metrics and their exporter, made before the job is (a port in use changes
    nothing); closed when the command ends."""

    def __init__(self, port: int | None, host: str, gpu_hour_cost: float | None) -> None:
        self.port, self.host, self.gpu_hour_cost = port, host, gpu_hour_cost
        self.metrics: RunMetrics | None = None
        self.exporter: Exporter | None = None

    def start(self, say: Callable[[str], None] | None = None) -> RunMetrics | None:
        """Make the metrics (and bind the port, if one was given); None when neither is asked."""
        if self.port is None and self.gpu_hour_cost is None:
            return None
        from batchrun.metrics.exporter import start_exporter
        from batchrun.metrics.recorder import CostMeter, RunMetrics

        metrics = RunMetrics()
        if self.gpu_hour_cost is not None:
            metrics.cost = CostMeter(self.gpu_hour_cost)
        if self.port is not None:
            self.exporter = start_exporter(metrics, self.port, self.host)
            if say is not None:
                say(f"metrics: {self.exporter.url}")
        self.metrics = metrics
        return metrics

    def close(self) -> None:
        """Stop serving metrics (the port is free again)."""
        if self.exporter is not None:
            self.exporter.close()
            self.exporter = None
