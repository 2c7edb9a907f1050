"""The server's /metrics: the same families as a job's (batchrun/metrics), from one registry,
plus its batches by status.

Requests by outcome are the batches' request_counts summed (invalid lines are failed requests),
so that the page and the API always agree; the queue depth is the running batches' requests not
finished. The engine pool feeds the rest as a job's scheduler does (`watch`): latency, queue
wait since each batch was created, in flight, batch size, restarts by reason, OOM back-offs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from prometheus_client import generate_latest
from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from batchrun.metrics import names
from batchrun.metrics.recorder import RunMetrics
from batchrun.openai.records import Outcome, Request

# Per tenant (serve/tenants.py): its batches by status, its requests by outcome.
TENANT_BATCHES = "batchrun_tenant_batches"
TENANT_REQUESTS = "batchrun_tenant_requests"
SEP = "\x00"  # the pool's request ids: "<slot>\x00<custom_id>" (serve/router.py)
# The OpenAI Batch object's statuses: each is a series from the first scrape (0 until a batch
# has it), so that a panel or an alert on one has data before the first batch.
BATCH_STATUSES = (
    "validating", "failed", "in_progress", "finalizing", "completed", "expired", "cancelling",
    "cancelled",
)  # fmt: skip


class Metrics:
    """The server's registry; `gauges` (the runner's) says what the batches hold when the page
    is asked for."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.gauges: Callable[[], Mapping[str, object]] = dict
        self.run = RunMetrics()
        # Tokens are counted as they are journaled (`count`), not as the pool hears them.
        self.run.count_tokens = False
        self.run.requests_source = self._requests
        self.run.queue_depth = lambda: int(self._gauge("queue_depth", 0))
        self.run.extra = self._batches
        self._pool: Any = None

    def watch(self, pool: Any, jobs: Mapping[str, Any] | None = None) -> None:
        """Feed the metrics from this engine pool (a Scheduler made with them) from now on; `jobs`: the
        active batches by slot, whose creation starts their requests' queue wait."""
        run = self.run
        with self._lock:
            if self._pool is not None:  # a pool of another kind took over: keep its counts
                run.cached_base += run.cached_tokens()
            self._pool = pool
        workers = pool.workers
        run.in_flight = lambda: sum(len(w.inflight) for w in workers)
        run.batch_size = lambda: pool.batch_size
        run.cached_tokens = lambda: sum(w.cache_hits for w in workers)
        if jobs is not None:
            run.queue_origin = _by_slot(jobs)

    def count(self, outcomes: Sequence[Outcome]) -> None:
        """Count the tokens of journaled outcomes."""
        run = self.run
        prompt = sum(int(o.prompt_tokens or 0) for o in outcomes)
        completion = sum(int(o.completion_tokens or 0) for o in outcomes)
        with run.lock:
            run.tokens["prompt"] += prompt
            run.tokens["completion"] += completion

    def render(self) -> str:
        """The Prometheus text exposition."""
        return generate_latest(self.run.registry).decode("utf-8")

    def _gauge(self, key: str, default: object) -> Any:
        return self.gauges().get(key, default)

    def _requests(self) -> Mapping[str, int]:
        requests = self._gauge("requests", {"succeeded": 0, "failed": 0})
        return {str(k): int(v) for k, v in dict(requests).items()}

    def _batches(self) -> Sequence[Metric]:
        family = GaugeMetricFamily(names.BATCHES, "Batches by status.", labels=["status"])
        by_status = {**dict.fromkeys(BATCH_STATUSES, 0), **dict(self._gauge("batches", {}))}
        for status, n in sorted(by_status.items()):
            family.add_metric([str(status)], n)
        # Per tenant, named as the keys file names it (or key- and 8 hex digits), never by key.
        batches = GaugeMetricFamily(
            TENANT_BATCHES, "Batches by tenant and status.", labels=["tenant", "status"]
        )
        for (tenant, status), n in sorted(dict(self._gauge("tenant_batches", {})).items()):
            batches.add_metric([str(tenant), str(status)], n)
        requests = GaugeMetricFamily(
            TENANT_REQUESTS,
            "Requests by tenant and outcome (its batches' request_counts summed).",
            labels=["tenant", "outcome"],
        )
        for (tenant, outcome), n in sorted(dict(self._gauge("tenant_requests", {})).items()):
            requests.add_metric([str(tenant), str(outcome)], n)
        return [family, batches, requests]


def _by_slot(jobs: Mapping[str, Any]) -> Callable[[Request], float | None]:
    """A request's queue origin: its batch's creation (the slot is its engine id's prefix)."""

    def origin(request: Request) -> float | None:
        slot, sep, _ = request.custom_id.partition(SEP)
        job = jobs.get(slot) if sep else None
        return float(job.manifest.created_at) if job is not None else None

    return origin
