"""serve's /metrics: the same families as a job's, from the engine pool (latency, queue wait since
the batch was created, batch size) and the batches (requests equal to their request_counts)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.lines import chat_line, write_jsonl
from support.serving import API_KEY, create_batch, start_server, stop_server, wait_done

from batchrun.metrics import names

pytestmark = pytest.mark.slow  # out of the fast tier: docs/development.md

AUTH = {"Authorization": f"Bearer {API_KEY}"}


def test_serve_exports_the_job_families_with_its_batches(tmp_path: Path) -> None:
    """After one batch of 30 requests (one failing): every request has a latency and a queue
    wait, the totals equal the batch's request_counts, tokens the output's."""
    server = start_server(
        tmp_path / "root", "--api-key", API_KEY, "--batch-size", "4",
        env={"BATCHRUN_ECHO_DELAY_MS": "10", "BATCHRUN_ECHO_FAIL": "s3"},
    )  # fmt: skip
    try:
        client = server.client()
        lines = [chat_line(f"s{i}", f"x {i}") for i in range(30)]
        batch = create_batch(client, write_jsonl(tmp_path / "in.jsonl", lines))
        done = wait_done(client, batch.id)
        text = httpx.get(server.url + "/metrics", headers=AUTH).text
    finally:
        stop_server(server)
    families = {f.name: f for f in text_string_to_metric_families(text)}
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in families.values()
        for s in f.samples
    }
    assert done.request_counts is not None
    assert samples[("batchrun_requests_total", (("outcome", "succeeded"),))] == (
        done.request_counts.completed
    )
    assert samples[("batchrun_requests_total", (("outcome", "failed"),))] == 1
    # The failed request is retried (max attempts 3): 29 + 3 attempts, each with a latency.
    assert samples[("batchrun_request_latency_seconds_count", ())] == 32
    assert samples[("batchrun_request_queue_seconds_count", ())] == 32
    assert samples[("batchrun_batch_size", ())] == 4
    assert samples[("batchrun_requests_in_flight", ())] == 0
    assert samples[("batchrun_queue_depth", ())] == 0
    assert samples[("batchrun_batches", (("status", "completed"),))] == 1
    assert samples[("batchrun_tokens_total", (("kind", "completion"),))] > 0
    for family in (names.REQUESTS, names.TOKENS, names.RESTARTS, names.OOM_BACKOFFS):
        assert family.removesuffix("_total") in families
    assert families["batchrun_request_latency_seconds"].type == "histogram"
