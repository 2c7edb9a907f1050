"""--metrics-port, --metrics-host, --metrics-pushgateway and --gpu-hour-cost: the options of
submit, resume and retry-failed that export a run's metrics, as their table declares them
(batchrun/options/metrics.py); metrics/monitoring.py starts what they ask for."""

from __future__ import annotations

from typing import Annotated

from batchrun.options.metrics import METRICS_OPTIONS

_OPTIONS = {o.name: o for o in METRICS_OPTIONS}

MetricsPort = Annotated[int | None, _OPTIONS["metrics_port"].info(override=False)]
MetricsHost = Annotated[str | None, _OPTIONS["metrics_host"].info(override=False)]
MetricsPushgateway = Annotated[str | None, _OPTIONS["metrics_pushgateway"].info(override=False)]
GpuHourCost = Annotated[float | None, _OPTIONS["gpu_hour_cost"].info(override=False)]
