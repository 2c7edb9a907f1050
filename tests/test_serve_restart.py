"""kill -9 of `batchrun serve` mid-batch, then a restart on the same root: every file and batch
is back, the batch continues, and each custom_id is answered exactly once."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import openai
import pytest
from openai.types import Batch
from support import serving
from support.cli import cli
from support.jobs import journal_records
from support.lines import chat_line, write_jsonl
from support.processes import group_alive
from support.waits import results_at_least, wait_until

from batchrun.serve.batches import RECORD_NAME

pytestmark = pytest.mark.slow  # out of the fast tier: docs/development.md


def test_kill_9_mid_batch_then_restart_answers_each_request_once(tmp_path: Path) -> None:
    """A client polls across the kill and the restart and sees the batch complete. Half the
    lines repeat the other half (greedy): run once each, answered for both, across the kill."""
    root = tmp_path / "root"
    n = 800
    first = serving.start_server(root, *serving.SLOW_ENGINE, env=serving.SLOW_ENV)
    client = first.client()
    lines = [chat_line(f"req-{i:04d}", f"hello {i % 400}", temperature=0) for i in range(n)]
    src = write_jsonl(tmp_path / "in.jsonl", lines)
    batch = serving.create_batch(client, src, metadata={"k": "v"})
    job = first.batch_dir(batch.id)
    wait_until(results_at_least(job, 200), "200 requests of the batch finish")
    # A client keeps polling across the kill and the restart, as the loop does.
    seen: list[str] = []
    final: list[Batch] = []
    clients = [client]  # the poller uses the last: the restarted server has another port

    def poll() -> None:
        while not final:
            try:
                b = clients[-1].batches.retrieve(batch.id)
            except (openai.APIConnectionError, httpx.HTTPError):
                seen.append("down")
                threading.Event().wait(0.05)
                continue
            seen.append(b.status)
            if b.status in ("completed", "failed", "expired", "cancelled"):
                final.append(b)
            threading.Event().wait(0.05)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    serving.stop_server(first, signal.SIGKILL)  # the server and its engine worker, at once
    wait_until(lambda: not group_alive(first.process.pid), "the killed server's processes are gone")
    assert len(journal_records(job)) < n  # killed mid-batch
    second = serving.start_server(root, *serving.SLOW_ENGINE, env=serving.SLOW_ENV)
    try:
        client = second.client()
        clients.append(client)
        poller.join(timeout=60)
        assert final, "the poller never saw the batch end"
        done = serving.wait_done(client, batch.id)
        assert done.status == "completed" and done.metadata == {"k": "v"}
        assert "down" in seen and seen[-1] == "completed"
        assert done.request_counts is not None
        assert (done.request_counts.total, done.request_counts.completed) == (n, n)
        records = [r for r in journal_records(job) if r["kind"] == "result"]
        results = Counter(r["custom_id"] for r in records)
        assert set(results.values()) == {1} and len(results) == n
        assert any("copy_of" in r for r in records)  # the duplicates were answered as copies
        output = [line["custom_id"] for line in serving.lines_of(client, done.output_file_id)]
        assert sorted(output) == [f"req-{i:04d}" for i in range(n)]
        assert batch.input_file_id in {f.id for f in client.files.list()}
    finally:
        serving.stop_server(second)


def test_sigterm_to_the_servers_group_stops_it_without_restarting_a_worker(
    tmp_path: Path,
) -> None:
    """SIGTERM to the whole process group (`kill -- -PGID`, a service manager stopping its unit)
    while a batch runs: the server stops gracefully; its worker, which leaves stopping to its
    parent, is neither seen to die nor restarted; a restart finishes the batch."""
    root = tmp_path / "root"
    server = serving.start_server(root, *serving.SLOW_ENGINE, env=serving.SLOW_ENV)
    client = server.client()
    batch = serving.create_batch(client, serving.requests_file(tmp_path / "in.jsonl", 400))
    job = server.batch_dir(batch.id)
    wait_until(results_at_least(job, 40), "40 requests of the batch finish")
    serving.stop_server(server, signal.SIGTERM)  # to the whole group
    log = server.log.read_text()
    assert server.process.returncode == 143, log
    assert " died" not in log and log.count("starting echo engine") == 1, log
    # The stopped server's batch goes on when the server starts again: never with resume.
    exported = cli("export", "--job-dir", str(job))
    assert exported.returncode == 1 and "resume" not in exported.stderr
    assert f"batch {batch.id}, which runs on `batchrun serve --root {root}`" in exported.stderr
    again = serving.start_server(root, *serving.SLOW_ENGINE, env=serving.SLOW_ENV)
    try:
        done = serving.wait_done(again.client(), batch.id, timeout=60)
    finally:
        serving.stop_server(again)
    assert done.status == "completed" and done.request_counts is not None
    assert done.request_counts.completed == 400


def _status_is(client: openai.OpenAI, batch_id: str, wanted: str) -> bool:
    return client.batches.retrieve(batch_id).status == wanted


def _saved_status(job: Path) -> str:
    """The batch's status as its record on disk holds it (what a killed server left)."""
    return str(json.loads((job / RECORD_NAME).read_text())["batch"]["status"])


def test_kill_9_while_validating_then_while_finalizing_then_restart(tmp_path: Path) -> None:
    """The two ends of a batch are safe to run again: killed while its input is validated, then
    while its output is written, the server started again finishes it, each request once."""
    root = tmp_path / "root"
    n = 150_000  # a few seconds of validation and of finalizing here
    src = tmp_path / "big.jsonl"
    with src.open("w") as f:
        for i in range(n):
            f.write(json.dumps(chat_line(f"r{i:06d}", f"hello {i}")) + "\n")
    args = ("--max-file-bytes", str(100 * 2**20), "--batch-size", "256")
    first = serving.start_server(root, *args)
    client = first.client()
    batch = serving.create_batch(client, src)
    job = first.batch_dir(batch.id)
    wait_until(lambda: job.exists(), "the batch's job directory exists", every=0.01)
    assert client.batches.retrieve(batch.id).status == "validating"
    serving.stop_server(first, signal.SIGKILL)  # in the middle of the validation
    wait_until(lambda: not group_alive(first.process.pid), "the killed server is gone")
    assert _saved_status(job) == "validating"
    second = serving.start_server(root, *args)
    client = second.client()
    wait_until(lambda: _status_is(client, batch.id, "finalizing"), "finalizing", every=0.01)
    serving.stop_server(second, signal.SIGKILL)  # in the middle of writing the output
    wait_until(lambda: not group_alive(second.process.pid), "the killed server is gone")
    assert _saved_status(job) == "finalizing"
    third = serving.start_server(root, *args)
    try:
        client = third.client()
        done = serving.wait_done(client, batch.id, timeout=120)
        assert done.status == "completed" and done.request_counts is not None
        assert (done.request_counts.total, done.request_counts.completed) == (n, n)
        results = Counter(r["custom_id"] for r in journal_records(job) if r["kind"] == "result")
        assert len(results) == n and set(results.values()) == {1}
        output = client.files.content(done.output_file_id or "").text.splitlines()
        assert len(output) == n
    finally:
        serving.stop_server(third)


def test_kill_9_keeps_the_killed_runs_time_in_the_batchs_wall_time(tmp_path: Path) -> None:
    """The killed server's run of the batch ends, in its manifest, when its run clock last saw it
    (status `killed`, all but the last seconds); the batch's wall time is both runs', and so is
    its cost (--gpu-hour-cost, remembered by the root for the second server)."""
    root = tmp_path / "root"
    first = serving.start_server(
        root, *serving.SLOW_ENGINE, "--gpu-hour-cost", "36", env=serving.SLOW_ENV
    )
    batch = serving.create_batch(first.client(), serving.requests_file(tmp_path / "in.jsonl", 1600))
    job = first.batch_dir(batch.id)
    wait_until(results_at_least(job, 40), "40 requests of the batch finish")
    started = json.loads((job / "manifest.json").read_text())["runs"][0]["started_at"]

    def seen() -> float:
        return float(json.loads((job / "run_clock.json").read_text())["seen_at"])

    # A sighting after the first one (the clock is written every 2 s) is on disk.
    wait_until(lambda: seen() > started + 1.0, "the run clock sees the run 1 s on")
    killed_at = time.time()
    serving.stop_server(first, signal.SIGKILL)
    wait_until(lambda: not group_alive(first.process.pid), "the killed server's processes are gone")
    assert len(journal_records(job)) < 1600  # killed mid-batch
    clock = json.loads((job / "run_clock.json").read_text())
    assert clock["started_at"] == started
    assert killed_at - 2.5 < clock["seen_at"] <= killed_at
    second = serving.start_server(root, *serving.SLOW_ENGINE, env=serving.SLOW_ENV)
    try:
        done = serving.wait_done(second.client(), batch.id, timeout=60)
    finally:
        serving.stop_server(second)
    assert done.status == "completed"
    runs = json.loads((job / "manifest.json").read_text())["runs"]
    assert [(r["mode"], r["status"]) for r in runs] == [("serve", "killed"), ("serve", "completed")]
    assert runs[0]["ended_at"] == clock["seen_at"]
    assert runs[0]["wall_s"] == round(clock["seen_at"] - started, 3) > 1.0
    assert runs[1]["wall_s"] > 0
    status = cli("status", "--job-dir", str(job), "--json")
    assert status.returncode == 0, status.stderr
    shown = json.loads(status.stdout)
    assert shown["runs"] == 2
    wall = runs[0]["wall_s"] + runs[1]["wall_s"]
    assert shown["wall_s"] == pytest.approx(wall, abs=0.002)
    # A CPU machine: one unit, at 36 USD an hour (a cent a second), over both runs.
    assert [(r["usd_per_hour"], r["units"]) for r in runs] == [(36.0, 1), (36.0, 1)]
    assert shown["cost"]["usd"] == pytest.approx(wall / 100, abs=1e-4)


def test_sigterm_closes_the_servers_run_as_interrupted_with_its_time(tmp_path: Path) -> None:
    """A server stopped with SIGTERM closes its run of each batch it ran: `interrupted`, with its
    wall time; the next server's run is added beside it."""
    root = tmp_path / "root"
    server = serving.start_server(root, *serving.SLOW_ENGINE, env=serving.SLOW_ENV)
    batch = serving.create_batch(
        server.client(), serving.requests_file(tmp_path / "in.jsonl", 1000)
    )
    job = server.batch_dir(batch.id)
    wait_until(results_at_least(job, 40), "40 requests of the batch finish")
    serving.stop_server(server, signal.SIGTERM)
    runs = json.loads((job / "manifest.json").read_text())["runs"]
    assert [(r["mode"], r["status"]) for r in runs] == [("serve", "interrupted")]
    assert runs[0]["wall_s"] == round(runs[0]["ended_at"] - runs[0]["started_at"], 3) > 0
