"""The /metrics endpoint of submit, resume and retry-failed: prometheus_client's own HTTP server
on a thread of the parent, bound before a job is made (a port in use changes nothing)."""

from __future__ import annotations

import errno
import threading
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from prometheus_client import start_http_server

from batchrun.config import OptionError
from batchrun.metrics.recorder import RunMetrics

DEFAULT_HOST = "127.0.0.1"


@dataclass
class Exporter:
    """A bound /metrics server and the metrics it serves."""

    metrics: RunMetrics
    host: str
    port: int  # the port bound (the one asked for, or the one chosen for port 0)
    server: WSGIServer
    thread: threading.Thread

    @property
    def url(self) -> str:
        """Where Prometheus scrapes it."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        """Stop serving and free the port."""
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def check_metrics_port(port: int | None) -> None:
    """Refuse a port no socket can bind (OptionError: a usage error)."""
    if port is not None and not 0 <= port <= 65535:
        raise OptionError("--metrics-port", f"must be a port number (0 to 65535), got {port}")


def start_exporter(metrics: RunMetrics, port: int, host: str | None = None) -> Exporter:
    """Serve `metrics` at http://HOST:PORT/metrics; a port in use or a bad host is a usage error."""
    host = host or DEFAULT_HOST
    check_metrics_port(port)
    try:
        server, thread = start_http_server(port, addr=host, registry=metrics.registry)
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            raise OptionError(
                "--metrics-port", f"port {port} on {host} is already in use; choose another"
            ) from None
        raise OptionError(
            ("--metrics-host", "--metrics-port"),
            f"cannot serve metrics on {host}:{port}: {e.strerror or e}",
        ) from None
    return Exporter(metrics, host, int(server.server_port), server, thread)
