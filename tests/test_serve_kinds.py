"""`batchrun serve` with generate and embed batches mixed: the engine pool switches kind as soon
as its kind has no work left (nothing pending, nothing in flight) and a batch of the other kind
waits; while its kind has work, it keeps the pool up to BATCHRUN_SERVE_KIND_SWITCH_S (default
120 s) for a batch of the other kind that comes first in the queue's order. A batch waiting for
its kind's engines stays `validating`, `in_progress_at` null, until its first request goes out.
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any

import pytest
from openai import OpenAI
from openai.types import Batch
from support import serving
from support.cli import cli
from support.jobs import journal_records
from support.lines import chat_line, write_jsonl
from support.waits import results_at_least, wait_until

from batchrun.errors import BatchrunError
from batchrun.serve.kinds import kind_switch_after

pytestmark = pytest.mark.slow  # out of the fast tier: docs/development.md

SLOW = {"BATCHRUN_ECHO_DELAY_MS": "20"}  # 4 at a time: about 200 requests a second
NAMES = ["g0", "e0", "g1", "e1", "g2", "e2"]


def embed_line(cid: str, text: str) -> dict[str, Any]:
    return {
        "custom_id": cid,
        "method": "POST",
        "url": "/v1/embeddings",
        "body": {"model": "test-model", "input": text},
    }


def make_batch(client: OpenAI, tmp: Path, name: str, n: int, priority: str) -> Batch:
    """A chat batch (`name` starting with g) or an embeddings batch (e) of `n` requests."""
    kind = "/v1/chat/completions" if name.startswith("g") else "/v1/embeddings"
    line = chat_line if name.startswith("g") else embed_line
    path = write_jsonl(tmp / f"{name}.jsonl", [line(f"{name}-{i}", f"text {i}") for i in range(n)])
    return serving.create_batch(client, path, endpoint=kind, metadata={"priority": priority})


def serve(tmp_path: Path, **env: str) -> serving.Server:
    return serving.start_server(
        tmp_path / "root", "--api-key", serving.API_KEY, "--batch-size", "4", "--workers", "1",
        env={**SLOW, **env},
    )  # fmt: skip


def result_span(server: serving.Server, batch_id: str) -> tuple[float, float]:
    times = [
        r["time"] for r in journal_records(server.batch_dir(batch_id)) if r["kind"] == "result"
    ]
    return min(times), max(times)


def test_a_batch_of_the_other_kind_runs_at_once_when_the_pool_is_idle(tmp_path: Path) -> None:
    """Generate and embed batches arrive one after the other, each made once the one before has
    ended, priorities alternating, with the switch time at its default (120 s): each completes
    within seconds, since the pool's kind has no work left (49-120 s each before: the pool kept
    its kind up to the switch time after its work was done). One engine start per switch."""
    server = serve(tmp_path, BATCHRUN_SERVE_KIND_SWITCH_S="120")
    try:
        client = server.client()
        made, took = [], []
        for name, priority in zip(NAMES, ("normal", "high") * 3, strict=True):
            began = time.monotonic()
            made.append(make_batch(client, tmp_path, name, 20, priority))
            assert serving.wait_done(client, made[-1].id, timeout=60).status == "completed"
            took.append(time.monotonic() - began)
        log = server.log.read_text()
    finally:
        serving.stop_server(server)
    assert max(took) < 15, took  # well under the 120 s limit
    assert log.count("starting echo engine") == 6, log[-4000:]
    spans = [result_span(server, b.id) for b in made]
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))


def test_a_batch_waiting_for_its_kinds_engines_shows_it_has_not_started(tmp_path: Path) -> None:
    """A long generate batch runs when a high-priority embed batch comes: the generate batch has
    work, so it keeps the pool (within the 120 s limit). Meanwhile the embed batch, validated,
    is `validating` with `in_progress_at` null; it turns in_progress when its first request goes
    to its engines, after the generate batch's last result (before, it read in_progress from
    its validation on, in_progress_at its creation)."""
    server = serve(tmp_path, BATCHRUN_SERVE_KIND_SWITCH_S="120")
    try:
        client = server.client()
        long = make_batch(client, tmp_path, "g0", 1200, "normal")  # about 6 s
        wait_until(results_at_least(server.batch_dir(long.id), 20), "the generate batch runs")
        waiting = make_batch(client, tmp_path, "e0", 20, "high")
        wait_until(
            lambda: (server.batch_dir(waiting.id) / "manifest.json").exists(),
            "the embed batch is validated",
        )
        seen = []
        while (shown := client.batches.retrieve(waiting.id)).status == "validating":
            seen.append((shown.in_progress_at, client.batches.retrieve(long.id).status))
            time.sleep(0.2)
        for b in (long, waiting):
            assert serving.wait_done(client, b.id, timeout=60).status == "completed"
        done = client.batches.retrieve(waiting.id)
        log = server.log.read_text()
    finally:
        serving.stop_server(server)
    # It waited while the generate batch ran, in_progress_at null all along.
    assert len(seen) >= 5 and {at for at, _ in seen} == {None}, seen
    # The generate batch ran all the while; between the two retrieves its last result may land,
    # so it can read finalizing at the end (the embed batch turns in_progress only after that).
    statuses = [status for _, status in seen]
    assert statuses[0] == "in_progress" and set(statuses) <= {"in_progress", "finalizing"}, seen
    assert statuses == sorted(statuses, key=["in_progress", "finalizing"].index), seen
    g_span, e_span = result_span(server, long.id), result_span(server, waiting.id)
    assert g_span[1] <= e_span[0]
    assert done.in_progress_at is not None
    assert int(g_span[1]) <= done.in_progress_at <= e_span[0]
    assert done.in_progress_at >= done.created_at + 2
    assert log.count("starting echo engine") == 2, log[-4000:]


def test_a_batch_waiting_for_its_kinds_engines_is_cancelled_at_once(tmp_path: Path) -> None:
    """The waiting embed batch of the test above, cancelled: it ends cancelled while the
    generate batch still runs, nothing of it run, in_progress_at null; no pooling engine starts."""
    server = serve(tmp_path, BATCHRUN_SERVE_KIND_SWITCH_S="120")
    try:
        client = server.client()
        long = make_batch(client, tmp_path, "g0", 2000, "normal")  # about 10 s
        wait_until(results_at_least(server.batch_dir(long.id), 20), "the generate batch runs")
        waiting = make_batch(client, tmp_path, "e0", 20, "high")
        wait_until(
            lambda: (server.batch_dir(waiting.id) / "manifest.json").exists(),
            "the embed batch is validated",
        )
        assert client.batches.cancel(waiting.id).status == "cancelling"
        cancelled = serving.wait_done(client, waiting.id, timeout=8)
        running = client.batches.retrieve(long.id).status
        assert serving.wait_done(client, long.id, timeout=60).status == "completed"
        log = server.log.read_text()
    finally:
        serving.stop_server(server)
    assert (cancelled.status, running) == ("cancelled", "in_progress")
    assert cancelled.in_progress_at is None and cancelled.request_counts is not None
    assert (cancelled.request_counts.total, cancelled.request_counts.completed) == (20, 0)
    assert not [r for r in journal_records(server.batch_dir(waiting.id)) if r["kind"] == "result"]
    assert log.count("starting echo engine") == 1, log[-4000:]


def test_a_batch_of_the_other_kind_waits_no_longer_than_the_switch_time(tmp_path: Path) -> None:
    """A long generate batch runs; a high-priority embed batch arrives. After
    BATCHRUN_SERVE_KIND_SWITCH_S (1 s here) the pool switches to it, and back after."""
    server = serve(tmp_path, BATCHRUN_SERVE_KIND_SWITCH_S="1")
    try:
        client = server.client()
        long = make_batch(client, tmp_path, "g0", 2000, "normal")  # about 10 s
        job = server.batch_dir(long.id)
        wait_until(results_at_least(job, 20), "the generate batch runs")
        urgent = make_batch(client, tmp_path, "e0", 40, "high")
        for b in (long, urgent):
            assert serving.wait_done(client, b.id, timeout=120).status == "completed"
        log = server.log.read_text()
    finally:
        serving.stop_server(server)
    assert log.count("starting echo engine") == 3, log[-4000:]
    assert result_span(server, urgent.id)[1] < result_span(server, long.id)[1]


def test_the_switch_time_is_read_from_the_environment() -> None:
    assert kind_switch_after({}) == 120.0
    assert kind_switch_after({"BATCHRUN_SERVE_KIND_SWITCH_S": "0"}) == 0.0
    with pytest.raises(BatchrunError) as e:
        kind_switch_after({"BATCHRUN_SERVE_KIND_SWITCH_S": "-1"})
    assert str(e.value) == (
        "BATCHRUN_SERVE_KIND_SWITCH_S must be a number of seconds, 0 or more, not '-1'"
    )


def test_a_bad_kind_switch_time_is_refused_before_the_root_is_made(tmp_path: Path) -> None:
    root = tmp_path / "root"
    r = cli(
        "serve", "--root", str(root), "--engine", "echo",
        env={"BATCHRUN_SERVE_KIND_SWITCH_S": "soon"},
    )  # fmt: skip
    assert r.returncode == 1
    assert r.stderr.strip().endswith(
        "BATCHRUN_SERVE_KIND_SWITCH_S must be a number of seconds, 0 or more, not 'soon'"
    ), r.stderr
    assert not root.exists()
