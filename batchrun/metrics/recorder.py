"""What a run counts (the scheduler feeds it) and its Prometheus registry, scraped at /metrics.

The parent counts what it sees: each request's dispatch and result (latency, queue wait,
outcome, tokens), restarts and out-of-memory back-offs; the workers' engine facts arrive with
their outcomes (time to first token) or their messages (prefix-cache hits). Gauges (queue depth,
in flight, batch size) and the cost are read from the run when the page is scraped, so they cost
the hot path nothing.
"""

from __future__ import annotations

import operator
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from itertools import repeat
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from batchrun.errors import BatchrunError
from batchrun.job.cost import gpu_units as gpu_units  # re-exported: metrics.gpu_units
from batchrun.metrics import names
from batchrun.metrics.gpu import GpuCollector
from batchrun.metrics.histogram import FastHistogram
from batchrun.openai.records import Outcome, Request

if TYPE_CHECKING:
    from batchrun.job.figures import JobFigures

OUTCOMES = ("succeeded", "failed", "invalid")
_CUSTOM_ID = operator.attrgetter("custom_id")
_FIRST = operator.itemgetter(0)
_SECOND = operator.itemgetter(1)
_TTFT = operator.attrgetter("ttft_s")


def _zero() -> int:
    return 0


class RunMetrics(Collector):
    """The counters, histograms and gauges of one process's runs, in a registry of their own.

    Requests count once each, when their outcome is final: succeeded, failed for good (not
    retryable, or out of attempts), or invalid (an input line that never runs). Tokens count
    every attempt the engine ran.
    """

    def __init__(self, *, gpus: bool = True) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.requests = dict.fromkeys(OUTCOMES, 0)
        self.tokens = {"prompt": 0, "completion": 0}
        self.restarts: dict[str, int] = {}
        self.oom_backoffs = 0
        # Requests answered from --cache-dir (run/answer_cache.py): journaled, never run.
        self.cache_hits = 0
        # The job's id, for the Pushgateway's grouping key (set when a job's run starts).
        self.job_id: str | None = None
        self.latency = FastHistogram(
            names.LATENCY,
            "Seconds from a request's dispatch to a worker to its result.",
            names.LATENCY_BUCKETS,
        )
        self.queue = FastHistogram(
            names.QUEUE,
            "Seconds a request waited before its dispatch (since the run started, or its batch "
            "was created under serve).",
            names.QUEUE_BUCKETS,
        )
        self.ttft = FastHistogram(
            names.TTFT,
            "Seconds from a request reaching the engine to its first token (engines that "
            "report it: vLLM).",
            names.TTFT_BUCKETS,
        )
        # custom_id (the engine's id) -> when it was dispatched (monotonic).
        self.sent: dict[str, float] = {}
        self.origin = time.monotonic()
        self.max_attempts = 1 << 30
        # Where the gauges come from (the scheduler's state); zero until a run (or serve's
        # engine pool) is watched, so that every family is there from the first scrape.
        self.queue_depth: Callable[[], int] = _zero
        self.in_flight: Callable[[], int] = _zero
        self.batch_size: Callable[[], int] = _zero
        self.cached_tokens: Callable[[], int] = _zero
        self.cached_base = 0
        # serve: requests by outcome are the batches' request_counts summed, not counted here.
        self.requests_source: Callable[[], Mapping[str, int]] | None = None
        self.extra: Callable[[], Sequence[Metric]] | None = None
        self.cost: CostMeter | None = None
        # The job's figures over every run (job/figures.py), read at scrape or push time;
        # None: no job (serve, whose batches have request_counts of their own).
        self.job_figures: Callable[[], JobFigures] | None = None
        # Where a request's queue wait starts (epoch seconds; serve: its batch's creation);
        # None: the run's start.
        self.queue_origin: Callable[[Request], float | None] | None = None
        # False where tokens are counted as they are journaled instead (serve).
        self.count_tokens = True
        self.lock = threading.Lock()
        self.registry.register(self)
        self.gpus: GpuCollector | None = None
        if gpus:
            self.gpus = GpuCollector()
            self.registry.register(self.gpus)

    # -- fed by the scheduler ---------------------------------------------------------------------

    def dispatched(self, requests: Sequence[Request]) -> None:
        """These requests were just sent to a worker (queued since the run's start, or since
        `queue_origin` says)."""
        now = time.monotonic()
        # C loops (map, zip, repeat), not Python ones: this runs for every request.
        self.sent.update(dict.fromkeys(map(_CUSTOM_ID, requests), now))
        if self.queue_origin is None:
            self.queue.observe(max(0.0, now - self.origin), len(requests))
            return
        wall = time.time()
        waits = []
        for r in requests:
            created = self.queue_origin(r)
            waits.append(max(0.0, wall - created) if created is not None else now - self.origin)
        self.queue.observe_many(waits)

    def results(self, pairs: Sequence[tuple[Outcome, Request]]) -> None:
        """These outcomes just came back from a worker: their latency, and their time to first
        token where the engine measured it.

        In C loops (map, filter), not Python ones: this runs for every result.
        """
        now = time.monotonic()
        requests = map(_SECOND, pairs)
        sent_at = filter(None, map(self.sent.pop, map(_CUSTOM_ID, requests), repeat(None)))
        self.latency.observe_since(now, list(sent_at))
        # An engine measures every generated request's, or none (echo, pooling).
        if pairs and (pairs[0][0].ttft_s is not None or pairs[-1][0].ttft_s is not None):
            self.ttft.observe_many(list(filter(None, map(_TTFT, map(_FIRST, pairs)))))

    def counted(
        self,
        outcomes: Sequence[Outcome],
        succeeded: int,
        prompt: int,
        completion: int,
        attempts: Mapping[str, int],
    ) -> None:
        """These outcomes were journaled (the scheduler's own sums given); `attempts`: each
        custom_id's attempts so far, this one included. A failure counts when it is final."""
        failed = 0
        if succeeded != len(outcomes):
            limit = self.max_attempts
            for o in outcomes:
                if not o.ok and (not o.retryable or attempts.get(o.custom_id, 0) >= limit):
                    failed += 1
        with self.lock:
            self.requests["succeeded"] += succeeded
            self.requests["failed"] += failed
            if self.count_tokens:
                self.tokens["prompt"] += prompt
                self.tokens["completion"] += completion

    def invalid(self, lines: int) -> None:
        """Input lines found invalid (they never run)."""
        with self.lock:
            self.requests["invalid"] += lines

    def from_cache(self, requests: int) -> None:
        """Requests answered from the answer cache (--cache-dir) were journaled."""
        with self.lock:
            self.cache_hits += requests

    def restarted(self, reason: str) -> None:
        """A worker started again after `reason` (names.RESTART_REASONS)."""
        with self.lock:
            self.restarts[reason] = self.restarts.get(reason, 0) + 1

    def backed_off(self) -> None:
        """A worker backed off to a smaller batch after running out of memory."""
        with self.lock:
            self.oom_backoffs += 1

    # -- scraped ----------------------------------------------------------------------------------

    def _job_families(self) -> Iterator[Metric]:
        """The job's requests by status, wall time and cost over every run, as `status` shows
        them (none when the job cannot be read at this moment: the next scrape tries again)."""
        if self.job_figures is None:
            return
        try:
            figures = self.job_figures()
        except (BatchrunError, OSError, ValueError):
            return
        family = GaugeMetricFamily(
            names.JOB_REQUESTS,
            "The job's requests by status over every run (as `batchrun status` counts them).",
            labels=["status"],
        )
        counts = figures.counts
        for status in names.JOB_STATUSES:
            family.add_metric([status], counts[status])
        yield family
        yield GaugeMetricFamily(
            names.JOB_WALL, "The job's runs' wall time, killed runs included.", value=figures.wall_s
        )
        usd = figures.cost["usd"] if figures.cost else 0.0
        yield GaugeMetricFamily(
            names.JOB_COST, "The job's cost over every run (--gpu-hour-cost).", value=usd
        )
        attempts = GaugeMetricFamily(
            names.JOB_WORKER_ATTEMPTS,
            "Engine attempts each worker ran over every run (as `batchrun status` shows them).",
            labels=["worker"],
        )
        rates = GaugeMetricFamily(
            names.JOB_WORKER_TOKENS_PER_SECOND,
            "Each worker's generated tokens a second of its own active time.",
            labels=["worker"],
        )
        for row in figures.workers:
            attempts.add_metric([str(row["worker"])], row["requests"])
            if row["tokens_per_s"] is not None:
                rates.add_metric([str(row["worker"])], row["tokens_per_s"])
        yield attempts
        yield rates

    def collect(self) -> Iterator[Metric]:
        """Every family this run exports (the GPU ones come from their own collector)."""
        with self.lock:
            requests = dict(self.requests)
            tokens = dict(self.tokens)
            restarts = dict(self.restarts)
            backoffs = self.oom_backoffs
            cache_hits = self.cache_hits
        if self.requests_source is not None:
            requests = {**dict.fromkeys(OUTCOMES, 0), **self.requests_source()}
        family = CounterMetricFamily(
            names.REQUESTS, "Requests by final outcome.", labels=["outcome"]
        )
        for outcome, n in requests.items():
            family.add_metric([outcome], n)
        yield family
        tokens["cached"] = self.cached_base + self.cached_tokens()
        family = CounterMetricFamily(
            names.TOKENS,
            "Tokens of the results journaled (duplicates' copies and answers from the cache "
            "included, as status counts them): prompt, completion; and prompt tokens found in "
            "the prefix cache.",
            labels=["kind"],
        )
        for kind in ("prompt", "completion", "cached"):
            family.add_metric([kind], tokens[kind])
        yield family
        yield self.latency.family()
        yield self.queue.family()
        if self.ttft.count:
            yield self.ttft.family()
        for name, doc, read in (
            (names.QUEUE_DEPTH, "Requests waiting to be dispatched.", self.queue_depth),
            (names.IN_FLIGHT, "Requests dispatched to a worker, no result yet.", self.in_flight),
            (names.BATCH_SIZE, "Sequences each engine runs at once.", self.batch_size),
        ):
            yield GaugeMetricFamily(name, doc, value=read())
        yield from self._job_families()
        family = CounterMetricFamily(
            names.RESTARTS, "Engine worker restarts by reason.", labels=["reason"]
        )
        for reason in names.RESTART_REASONS:
            family.add_metric([reason], restarts.get(reason, 0))
        yield family
        yield CounterMetricFamily(
            names.OOM_BACKOFFS,
            "Out-of-memory back-offs to a smaller batch size.",
            value=backoffs,
        )
        yield CounterMetricFamily(
            names.CACHE_HITS,
            "Requests answered from the answer cache (--cache-dir): journaled, not run by the "
            "engine (they count in batchrun_requests_total too).",
            value=cache_hits,
        )
        if self.cost is not None:
            yield CounterMetricFamily(
                names.COST,
                "What the run cost so far, from --gpu-hour-cost and its GPUs (or machine).",
                value=self.cost.usd(),
            )
        if self.extra is not None:
            yield from self.extra()


class CostMeter:
    """USD per GPU-hour (per machine-hour on a CPU) times the units a run holds, over its time."""

    def __init__(self, usd_per_hour: float) -> None:
        self.usd_per_hour = usd_per_hour
        self.units = 1
        self.recorded = 0.0  # USD already written to the job's cost.json
        self._spent_s = 0.0
        self._since: float | None = None

    def start(self, units: int) -> None:
        """A run holding `units` GPUs (1 on a CPU) starts now."""
        self.units = max(1, units)
        self._since = time.monotonic()

    def stop(self) -> None:
        """The run ended: its time is spent."""
        if self._since is not None:
            self._spent_s += (time.monotonic() - self._since) * self.units
            self._since = None

    def usd(self) -> float:
        """USD spent so far."""
        unit_s = self._spent_s
        if self._since is not None:
            unit_s += (time.monotonic() - self._since) * self.units
        return self.usd_per_hour * unit_s / 3600.0


def attach(
    metrics: RunMetrics,
    scheduler: Any,
    *,
    queue_depth: Callable[[], int],
    envs: Sequence[Mapping[str, Any]],
    max_attempts: int,
    invalid: int = 0,
    job_id: str | None = None,
) -> None:
    """Point the gauges of `metrics` (which the run's scheduler was made with, run/passes.py)
    at that scheduler: they read its state at scrape time, queue waits count from now, the cost
    meter starts; `job_id` names the job to the Pushgateway."""
    workers = scheduler.workers
    if job_id is not None:
        metrics.job_id = job_id
    metrics.origin = time.monotonic()
    metrics.max_attempts = max_attempts
    metrics.queue_depth = queue_depth
    metrics.in_flight = lambda: sum(len(w.inflight) for w in workers)
    metrics.batch_size = lambda: scheduler.batch_size
    metrics.cached_tokens = lambda: sum(w.cache_hits for w in workers)
    devices = [
        d.strip()
        for env in envs
        for d in str(env.get("CUDA_VISIBLE_DEVICES") or "").split(",")
        if d.strip()
    ]
    if metrics.gpus is not None:
        metrics.gpus.devices = lambda: devices or None
    if invalid:
        metrics.invalid(invalid)
    if metrics.cost is not None:
        metrics.cost.start(gpu_units(envs))


def detach(metrics: RunMetrics, scheduler: Any) -> None:
    """The run ended: its gauges keep their last values, its cost stops growing."""
    in_flight = sum(len(w.inflight) for w in scheduler.workers)
    size = scheduler.batch_size
    metrics.in_flight = lambda: in_flight
    metrics.batch_size = lambda: size
    metrics.cached_base += metrics.cached_tokens()
    metrics.cached_tokens = _zero
    metrics.sent.clear()
    if metrics.cost is not None:
        metrics.cost.stop()
