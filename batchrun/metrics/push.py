"""The Pushgateway pusher of submit, resume and retry-failed (--metrics-pushgateway): the run's
registry, the one /metrics serves, pushed every few seconds and once more at the end, so that a
batch job's final counts outlive its process (Prometheus' way for batch jobs).

Pushes run on a thread of their own, each with a timeout: a gateway that is down, slow or
answers 5xx never stops or slows the job. The first failure is one warning line; later pushes
are tried again on schedule; the job's exit code is its own.
"""

from __future__ import annotations

import threading
import urllib.error
from collections.abc import Callable
from urllib.parse import urlsplit

from prometheus_client import push_to_gateway

from batchrun.errors import OptionError
from batchrun.metrics.recorder import RunMetrics

OPTION = "--metrics-pushgateway"
# The grouping key: job="batchrun" plus the job's id (job_id), one group per job.
JOB = "batchrun"
JOB_ID_LABEL = "job_id"
INTERVAL_S = 5.0
# Each push gives up after this long: the final one holds the command's exit at most this long.
TIMEOUT_S = 3.0


def gateway_url(given: str) -> str:
    """The Pushgateway's base URL: `host:port` gets http:// (as prometheus_client and curl do);
    another scheme, no host or a bad port is a usage error (OptionError)."""
    url = given.strip()
    if "://" not in url:
        url = f"http://{url}"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (it raises ValueError on a port that is not a number)
    except ValueError:
        raise OptionError(OPTION, f"not a URL: {given!r}") from None
    if parts.scheme not in ("http", "https"):
        raise OptionError(OPTION, f"must be an http:// or https:// URL, got {given!r}")
    if not parts.hostname:
        raise OptionError(OPTION, f"names no host: {given!r} (e.g. http://127.0.0.1:9091)")
    if parts.query or parts.fragment:
        raise OptionError(OPTION, f"takes no query or fragment: {given!r}")
    return url.rstrip("/")


def _reason(error: BaseException) -> str:
    """A push's failure in a few words (a refused connection, a timeout, an HTTP status)."""
    if isinstance(error, urllib.error.HTTPError):
        return f"HTTP {error.code} {error.reason}"
    if isinstance(error, urllib.error.URLError):
        reason = error.reason
        return str(getattr(reason, "strerror", None) or reason)
    return str(error) or type(error).__name__


class Pusher:
    """Pushes `metrics.registry` to a Pushgateway under job="batchrun" and the job's id, every
    `interval` seconds from a thread, and once more on `close` (after the run's last count)."""

    def __init__(
        self,
        url: str,
        metrics: RunMetrics,
        warn: Callable[[str], None],
        *,
        interval: float = INTERVAL_S,
        timeout: float = TIMEOUT_S,
    ) -> None:
        self.url = url
        self.metrics = metrics
        self.warn = warn
        self.interval = interval
        self.timeout = timeout
        self.pushes = 0  # pushes the gateway accepted
        self.failures = 0
        self._warned = False
        self._stop = threading.Event()
        self._lock = threading.Lock()  # one push at a time: the final one never races the thread
        self._thread = threading.Thread(target=self._loop, name="batchrun-push", daemon=True)

    def start(self) -> Pusher:
        """Start pushing on schedule."""
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop the schedule and push once more: the run's final counts."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.timeout + 1.0)
        self.push()

    def push(self) -> bool:
        """One push of the registry as it is now; False when the gateway did not take it (said
        once) or the job has no id yet (the run has not started)."""
        job_id = self.metrics.job_id
        if job_id is None:
            return False
        with self._lock:
            try:
                push_to_gateway(
                    self.url,
                    job=JOB,
                    registry=self.metrics.registry,
                    grouping_key={JOB_ID_LABEL: job_id},
                    timeout=self.timeout,
                )
            except Exception as e:  # any failure of the gateway must leave the job alone
                self.failures += 1
                if not self._warned:
                    self._warned = True
                    self.warn(
                        f"warning: {OPTION}: cannot push to {self.url} ({_reason(e)}); the job "
                        f"goes on and pushes are tried again every {self.interval:g}s"
                    )
                return False
            self.pushes += 1
            return True

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.push()
