"""The metrics options of run, submit, Job.resume and Job.retry_failed (`metrics_port`,
`metrics_host`, `metrics_pushgateway`, `gpu_hour_cost`: the CLI's --metrics-port, ...), checked
as the CLI's parser checks them and started as the CLI starts them: the port bound before the
job is made or changed, everything closed when the call ends. batchrun.metrics (prometheus_client,
~140 ms) is imported only when one is given."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from batchrun.options.metrics import METRICS_OPTIONS
from batchrun.options.values import cli_value

if TYPE_CHECKING:
    from batchrun.metrics.monitoring import Monitoring
    from batchrun.metrics.recorder import RunMetrics

_TABLE = {option.name: option for option in METRICS_OPTIONS}


def monitoring(
    port: int | None, host: str | None, pushgateway: str | None, gpu_hour_cost: float | None
) -> Monitoring | None:
    """What the metrics options given ask for (None: nothing), each value checked as the CLI's
    flag is (a bad one raises its line: options/values.py); nothing is bound yet."""
    given = {
        "metrics_port": port,
        "metrics_host": host,
        "metrics_pushgateway": pushgateway,
        "gpu_hour_cost": gpu_hour_cost,
    }
    values = {
        name: cli_value(_TABLE[name], value, override=False)
        for name, value in given.items()
        if value is not None
    }
    if not values:
        return None
    from batchrun.metrics.monitoring import Monitoring

    return Monitoring(
        port=values.get("metrics_port"),
        host=values.get("metrics_host"),
        gpu_hour_cost=values.get("gpu_hour_cost"),
        pushgateway=values.get("metrics_pushgateway"),
    )


@contextmanager
def started(monitoring: Monitoring | None) -> Iterator[RunMetrics | None]:
    """The run's metrics, started (the port bound: a port in use raises the CLI's line, exit 2)
    and closed again when the block ends (the final counts pushed, the port freed)."""
    if monitoring is None:
        yield None
        return
    try:
        yield monitoring.start(_say)
    finally:
        monitoring.close()


def _say(line: str) -> None:
    """Where the metrics are (`metrics: http://127.0.0.1:PORT/metrics`), on stderr, as the
    CLI's line and the runner's own."""
    sys.stderr.write(line + "\n")
