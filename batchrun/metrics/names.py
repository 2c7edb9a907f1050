"""The metric families batchrun exports: a contract (dashboards and alerts name them).

Named as Prometheus and vLLM name theirs: a unit suffix, `_total` on counters, no per-request
labels (each label's values are a small fixed set).
"""

from __future__ import annotations

REQUESTS = "batchrun_requests_total"
TOKENS = "batchrun_tokens_total"
LATENCY = "batchrun_request_latency_seconds"
QUEUE = "batchrun_request_queue_seconds"
TTFT = "batchrun_time_to_first_token_seconds"
QUEUE_DEPTH = "batchrun_queue_depth"
IN_FLIGHT = "batchrun_requests_in_flight"
BATCH_SIZE = "batchrun_batch_size"
RESTARTS = "batchrun_engine_restarts_total"
OOM_BACKOFFS = "batchrun_oom_backoffs_total"
GPU_MEMORY = "batchrun_gpu_memory_used_bytes"
GPU_UTILIZATION = "batchrun_gpu_utilization_ratio"
COST = "batchrun_cost_usd_total"
CACHE_HITS = "batchrun_cache_hits_total"
# serve only: its batches by status.
BATCHES = "batchrun_batches"
# The job's own figures over every run (job/figures.py: what `status` shows), read from the
# journal's fold when scraped or pushed: a resumed job's final push holds the whole job.
JOB_REQUESTS = "batchrun_job_requests"
JOB_WALL = "batchrun_job_wall_seconds"
JOB_COST = "batchrun_job_cost_usd"
# Per worker (label `worker`, its index): its engine attempts over every run, and its generated
# tokens a second of its own active time (docs/metrics.md's glossary).
JOB_WORKER_ATTEMPTS = "batchrun_job_worker_attempts"
JOB_WORKER_TOKENS_PER_SECOND = "batchrun_job_worker_completion_tokens_per_second"

# Every family, as an exposition names its samples' stems (a histogram's samples add _bucket,
# _sum and _count).
FAMILIES = (
    REQUESTS,
    TOKENS,
    LATENCY,
    QUEUE,
    TTFT,
    QUEUE_DEPTH,
    IN_FLIGHT,
    BATCH_SIZE,
    RESTARTS,
    OOM_BACKOFFS,
    GPU_MEMORY,
    GPU_UTILIZATION,
    COST,
    CACHE_HITS,
    BATCHES,
)
HISTOGRAMS = (LATENCY, QUEUE, TTFT)
# The statuses of JOB_REQUESTS (job/figures.py's request counts).
JOB_STATUSES = ("succeeded", "failed", "pending", "invalid")

# Histogram buckets, in seconds. Latency: vLLM's e2e request latency buckets, with finer ones
# below 0.3 s (the echo engine, short completions). Queue wait reaches hours on a large job.
LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0,
    30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
QUEUE_BUCKETS = (
    0.01, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0,
    7200.0, 14400.0, 28800.0, 86400.0,
)  # fmt: skip
# vLLM's time-to-first-token buckets.
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip

RESTART_REASONS = ("oom", "crash", "start_failure", "hang", "request_timeout", "resize")
