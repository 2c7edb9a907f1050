"""`batchrun serve` with generate and embed batches mixed: the engine pool switches kind rarely.

A switch stops one set of engines and starts another (minutes on GPUs), so the pool keeps its
kind while that kind has work, until a batch of the other kind, first in the queue's order, has
waited BATCHRUN_SERVE_KIND_SWITCH_S (default 120 s), and, its work done, until it has run
that long.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from conftest import chat_line, cli, journal_records, results_at_least, wait_until, write_jsonl
from openai import OpenAI
from openai.types import Batch
from serving import API_KEY, Server, start_server, stop_server, wait_done

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
    with path.open("rb") as f:
        uploaded = client.files.create(file=f, purpose="batch")
    return client.batches.create(
        input_file_id=uploaded.id,
        endpoint=kind,  # type: ignore[arg-type]
        completion_window="24h",
        metadata={"priority": priority},
    )


def serve(tmp_path: Path, **env: str) -> Server:
    return start_server(
        tmp_path / "root", "--api-key", API_KEY, "--batch-size", "4", "--workers", "1",
        env={**SLOW, **env},
    )  # fmt: skip


def result_span(server: Server, batch_id: str) -> tuple[float, float]:
    times = [
        r["time"] for r in journal_records(server.batch_dir(batch_id)) if r["kind"] == "result"
    ]
    return min(times), max(times)


def test_batches_of_both_kinds_arriving_in_turn_do_not_restart_the_engines_each_time(
    tmp_path: Path,
) -> None:
    """Generate and embed batches arrive one after the other, each done before the next comes,
    their priorities alternating: the generate pool takes the generate batches as they come
    while the embed batches wait (at most BATCHRUN_SERVE_KIND_SWITCH_S, 15 s here), then one
    switch runs them all. Engines start twice; they started once per batch (6) before."""
    server = serve(tmp_path, BATCHRUN_SERVE_KIND_SWITCH_S="15")
    try:
        client = server.client()
        first = make_batch(client, tmp_path, "g0", 20, "normal")
        assert wait_done(client, first.id, timeout=60).status == "completed"
        made = [first]
        for name, priority in (("e0", "high"), ("g1", "normal"), ("e1", "high"),
                               ("g2", "normal"), ("e2", "high")):  # fmt: skip
            made.append(make_batch(client, tmp_path, name, 20, priority))
            if name.startswith("g"):  # a batch of the pool's kind runs at once
                assert wait_done(client, made[-1].id, timeout=10).status == "completed"
            else:
                time.sleep(0.5)
        for b in made:
            assert wait_done(client, b.id, timeout=60).status == "completed"
        log = server.log.read_text()
    finally:
        stop_server(server)
    assert log.count("starting echo engine") == 2, log[-4000:]
    spans = {n: result_span(server, b.id) for n, b in zip(NAMES, made, strict=True)}
    # The embed batches ran after the last generate batch, in their order.
    assert spans["g2"][1] <= spans["e0"][0]
    assert spans["e0"][1] <= spans["e1"][0] and spans["e1"][1] <= spans["e2"][0]


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
            assert wait_done(client, b.id, timeout=120).status == "completed"
        log = server.log.read_text()
    finally:
        stop_server(server)
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
