"""--metrics-port, --metrics-host, --metrics-pushgateway and --gpu-hour-cost: the options of
submit, resume and retry-failed (and of the Python API's run, submit, Job.resume and
Job.retry_failed) that export a run's metrics and price its time (metrics/monitoring.py runs
them). Unlike the engine options they are the run's, never saved into the job: each reads its
BATCHRUN_* variable on every command."""

from __future__ import annotations

import math

from batchrun.options.option import Option, bad_value

PANEL = "Metrics"
# Where /metrics listens when --metrics-host is left out (metrics/exporter.py binds it).
DEFAULT_METRICS_HOST = "127.0.0.1"


def _finite_cost(value: float | None) -> float | None:
    """--gpu-hour-cost as given; nan and inf are refused (they would price a job at $nan)."""
    if value is not None and not math.isfinite(value):
        raise bad_value(f"must be a finite number of USD, got {value!r}")
    return value


GPU_HOUR_COST = Option(
    "gpu_hour_cost",
    float,
    "USD per GPU-hour (per machine-hour on a CPU): the run's cost in /metrics, status and "
    "the summary.",
    min=0.0,
    callback=_finite_cost,
    panel=PANEL,
    replaces=False,
)

METRICS_OPTIONS = (
    Option(
        "metrics_port",
        int,
        "Serve Prometheus metrics at http://HOST:PORT/metrics while the job runs (0: a free "
        "port, printed).",
        min=0,
        max=65535,
        panel=PANEL,
        replaces=False,
    ),
    Option(
        "metrics_host",
        str,
        "The address /metrics listens on.",
        default=DEFAULT_METRICS_HOST,
        panel=PANEL,
        replaces=False,
    ),
    Option(
        "metrics_pushgateway",
        str,
        "Push the job's metrics to this Prometheus Pushgateway (http://HOST:PORT; no scheme: "
        "http) every 5 s and once at the end, grouped by job and job_id: the final counts "
        "outlive the process.",
        metavar="URL",
        panel=PANEL,
        replaces=False,
    ),
    GPU_HOUR_COST,
)
