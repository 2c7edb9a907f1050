"""What --metrics-port, --metrics-host, --metrics-pushgateway and --gpu-hour-cost start for a
run of submit, resume or retry-failed (the CLI's or the Python API's): the run's metrics, their
/metrics endpoint and their Pushgateway pusher. Importing it costs nothing: prometheus_client
and the recorder are imported only when a run asks for metrics."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from batchrun.config import OptionError
from batchrun.errors import BatchrunError

if TYPE_CHECKING:
    from batchrun.metrics.exporter import Exporter
    from batchrun.metrics.push import Pusher
    from batchrun.metrics.recorder import RunMetrics


class Monitoring:
    """The run's metrics, their exporter and their pusher, made before the job is (a port in
    use or a bad URL changes nothing); closed when the command ends. `host` None: the
    exporter's default, 127.0.0.1."""

    def __init__(
        self,
        port: int | None,
        host: str | None,
        gpu_hour_cost: float | None,
        pushgateway: str | None = None,
    ) -> None:
        self.port, self.host, self.gpu_hour_cost = port, host, gpu_hour_cost
        self.pushgateway = pushgateway
        self.metrics: RunMetrics | None = None
        self.exporter: Exporter | None = None
        self.pusher: Pusher | None = None

    def start(self, say: Callable[[str], None] | None = None) -> RunMetrics | None:
        """Make the metrics (bind the port, start pushing, where asked); None when nothing is.

        Raises:
            BatchrunError: (exit 2) the port is in use, the host cannot be bound, or the
                Pushgateway's URL is bad; its message is the line the CLI prints, naming the
                option (`--metrics-port: port 9400 on 127.0.0.1 is already in use; choose
                another`).
        """
        if self.port is None and self.gpu_hour_cost is None and self.pushgateway is None:
            return None
        try:
            return self._start(say)
        except OptionError as e:
            raise BatchrunError(f"{' / '.join(e.options)}: {e}", exit_code=2) from None

    def _start(self, say: Callable[[str], None] | None) -> RunMetrics:
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
