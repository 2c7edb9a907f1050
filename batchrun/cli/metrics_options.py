"""--metrics-port, --metrics-host, --metrics-pushgateway and --gpu-hour-cost: the options of
submit, resume and retry-failed that export a run's metrics (batchrun/metrics), and the exporter
and pusher they start."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from batchrun.metrics.exporter import Exporter
    from batchrun.metrics.push import Pusher
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
MetricsPushgateway = Annotated[
    str | None,
    typer.Option(
        "--metrics-pushgateway",
        envvar="BATCHRUN_METRICS_PUSHGATEWAY",
        help="Push the job's metrics to this Prometheus Pushgateway (http://HOST:PORT; no scheme: http) every 5 s and once at the end, grouped by job and job_id: the final counts outlive the process.",
        show_default=False,
        metavar="URL",
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
    """The run's metrics, their exporter and their pusher, made before the job is (a port in
    use or a bad URL changes nothing); closed when the command ends."""

    def __init__(
        self,
        port: int | None,
        host: str,
        gpu_hour_cost: float | None,
        pushgateway: str | None = None,
    ) -> None:
        self.port, self.host, self.gpu_hour_cost = port, host, gpu_hour_cost
        self.pushgateway = pushgateway
        self.metrics: RunMetrics | None = None
        self.exporter: Exporter | None = None
        self.pusher: Pusher | None = None

    def start(self, say: Callable[[str], None] | None = None) -> RunMetrics | None:
        """Make the metrics (bind the port, start pushing, where asked); None when nothing is."""
        if self.port is None and self.gpu_hour_cost is None and self.pushgateway is None:
            return None
        from batchrun.metrics.exporter import start_exporter
        from batchrun.metrics.push import Pusher, gateway_url
        from batchrun.metrics.recorder import CostMeter, RunMetrics

        url = gateway_url(self.pushgateway) if self.pushgateway is not None else None
        metrics = RunMetrics()
        if self.gpu_hour_cost is not None:
            metrics.cost = CostMeter(self.gpu_hour_cost)
        if self.port is not None:
            self.exporter = start_exporter(metrics, self.port, self.host)
            if say is not None:
                say(f"metrics: {self.exporter.url}")
        if url is not None:
            self.pusher = Pusher(url, metrics, say or (lambda _: None)).start()
            if say is not None:
                say(f"metrics: pushing to {url} every {self.pusher.interval:g}s")
        self.metrics = metrics
        return metrics

    def close(self) -> None:
        """Push the final counts (once the run counted its last result), stop serving metrics
        (the port is free again)."""
        if self.pusher is not None:
            self.pusher.close()
            self.pusher = None
        if self.exporter is not None:
            self.exporter.close()
            self.exporter = None
