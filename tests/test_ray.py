"""Jobs on a Ray cluster (a local Ray instance here): same journal, same guarantees.

The actors ask for CPU resources only; the echo engine stands in where many workers or a killed
actor are needed, and the real vLLM engine runs in one actor when the shared completions job
(tests/support/vllm_jobs.py), started locally and killed, is resumed on Ray.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from support.cli import cli
from support.jobs import answer_models, journal_records, rerun, start_echo, submit_echo
from support.lines import chat_input, chat_line, read_jsonl, write_jsonl
from support.processes import group_alive, kill_group
from support.waits import results_at_least, wait_until

pytestmark = pytest.mark.ray

# Two actors on a local Ray instance, 8 requests a batch.
RAY_TWO = ("--batch-size", "8", "--ray", "local", "--workers", "2")


def answers(job: Path) -> dict[str, Any]:
    return {
        o["custom_id"]: o["response"]["body"]["choices"][0]["message"]["content"]
        for o in read_jsonl(job / "output.jsonl")
    }


def actor_pids(root: int, title: str = "ray::EngineActor") -> list[int]:
    """Processes of batchrun's Ray actors under the process `root` (its local Ray instance's
    workers: another test's Ray instance, running at the same time, is not counted). Ray names
    them after the actor class, and after the method one runs while it runs it: with `title`
    "ray::EngineActor.poll", the actors that have started and are running their engine."""
    pids = []
    for proc in psutil.Process(root).children(recursive=True):
        try:
            cmdline = proc.cmdline()
        except psutil.Error:
            continue
        if cmdline and cmdline[0].startswith(title):
            pids.append(proc.pid)
    return pids


def test_ray_results_match_a_single_machine_run(tmp_path: Path) -> None:
    src = chat_input(tmp_path / "in.jsonl", 300)
    local, on_ray = tmp_path / "local", tmp_path / "ray"
    env = {"BATCHRUN_ECHO_DELAY_MS": "5"}
    assert submit_echo(src, local, "--batch-size", "16", env=env).returncode == 0
    r = submit_echo(src, on_ray, "--batch-size", "16", "--ray", "local", "--workers", "3", env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    for i in range(3):
        assert f"[batchrun] ray worker {i} starting echo engine (batch size 16)" in (
            r.stderr.splitlines()
        )
    for job in (local, on_ray):
        assert cli("export", "--job-dir", str(job)).returncode == 0
    assert answers(on_ray) == answers(local)
    assert len(answers(local)) == 300
    status = json.loads(cli("status", "--job-dir", str(on_ray), "--json").stdout)
    workers = status["workers"]
    # Every actor that got work is listed; on a loaded machine the first actor up may take it all.
    assert workers and all(w["kind"] == "ray" and w["node"] for w in workers)
    assert sum(w["requests"] for w in workers) == 300


def test_an_embeddings_job_on_ray_keeps_its_vectors_in_the_actors_shards(tmp_path: Path) -> None:
    """An actor whose node sees the job directory (here, every one: the cluster is this machine)
    writes its results' bodies and vectors to a shard of its own there, as a worker process does
    (job/shards.py): the journal names them, 4 bytes a value, and export writes each one's own."""
    from support.vectors import embedding_lines, vector_of

    from batchrun.engines.echo import echo_vector_bytes
    from batchrun.job.shards import shards_dir

    src = write_jsonl(tmp_path / "in.jsonl", embedding_lines(40, 256))
    job = tmp_path / "job"
    r = submit_echo(src, job, "--ray", "local", "--workers", "2")
    assert r.returncode == 0, r.stderr[-3000:]
    assert (job / "journal.jsonl").read_bytes().count(b'"shard":["wray-') == 40
    assert not (job / "journal.f32").exists()
    shards = list(shards_dir(job).glob("wray-*.res"))
    # (Each body besides its vectors: some 150 bytes of JSON, a fair part of a 1 KiB vector.)
    assert shards and 40 * 256 * 4 < sum(p.stat().st_size for p in shards) < 40 * 256 * 4 * 1.2
    assert cli("export", "--job-dir", str(job)).returncode == 0
    outputs = {o["custom_id"]: o for o in read_jsonl(job / "output.jsonl")}
    for i in range(40):
        assert vector_of(outputs[f"e{i}"]) == echo_vector_bytes(f"passage {i}", 256)


def test_a_killed_actor_is_replaced_and_nothing_is_lost(tmp_path: Path) -> None:
    src = chat_input(tmp_path / "in.jsonl", 600)
    job = tmp_path / "job"
    p = start_echo(src, job, *RAY_TWO, env={"BATCHRUN_ECHO_DELAY_MS": "40"})
    try:
        wait_until(results_at_least(job, 50), "the job has 50 results")
        # On a loaded machine the second actor may still be starting when the first has done 50,
        # and killing that one is a failed start, not a lost worker. An actor seen in `poll` has
        # started and holds work: that is the one to kill.
        running: list[int] = []

        def one_polls() -> bool:
            running[:] = actor_pids(p.pid, "ray::EngineActor.poll")
            return bool(running)

        wait_until(one_polls, "a Ray actor is running requests")
        os.kill(running[0], signal.SIGKILL)
        _, stderr = p.communicate(timeout=300)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 0, stderr[-3000:]
    assert "the Ray actor was lost" in stderr and "Running them again in halves" in stderr
    lost = [line for line in stderr.splitlines() if "the Ray actor was lost" in line]
    assert len(lost) == 1, stderr[-3000:]
    # Ray's own words for the loss vary; the rest of the line does not.
    assert re.fullmatch(
        r"\[batchrun\] ray worker [01] \(\S+\) died holding \d+ requests: the Ray actor was "
        r"lost: .+\. Running them again in halves, each alone, to find the one that crashes it "
        r"\(at most \d+ more restarts?\); starting a fresh worker",
        lost[0],
    ), lost[0]
    assert sorted(x["custom_id"] for x in journal_records(job)) == sorted(
        f"r{i}" for i in range(600)
    )


def test_a_job_started_on_ray_is_resumed_without_it(tmp_path: Path) -> None:
    src = chat_input(tmp_path / "in.jsonl", 500)
    job = tmp_path / "job"
    p = start_echo(src, job, *RAY_TWO, env={"BATCHRUN_ECHO_DELAY_MS": "40"})
    wait_until(results_at_least(job, 50), "the job has 50 results")
    actors = actor_pids(p.pid)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    for pid in actors:  # a killed driver's local Ray instance goes down with it
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    done = len(journal_records(job))
    assert 50 <= done < 500
    r = rerun("resume", job)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "ray worker" not in r.stderr
    assert sorted(x["custom_id"] for x in journal_records(job)) == sorted(
        f"r{i}" for i in range(500)
    )


@pytest.mark.parametrize("second_after", [None, 0.02])
def test_ctrl_c_on_ray_leaves_no_process_behind(tmp_path: Path, second_after: float | None) -> None:
    """One Ctrl-C shuts the local Ray instance down; a second one, which stops at once, must
    not leave Ray's daemons and agents running either."""
    src = chat_input(tmp_path / "in.jsonl", 3000)
    job = tmp_path / "job"
    p = start_echo(src, job, *RAY_TWO, env={"BATCHRUN_ECHO_DELAY_MS": "50"})
    wait_until(results_at_least(job, 50), "the job has 50 results")
    os.killpg(p.pid, signal.SIGINT)
    if second_after is not None:
        time.sleep(second_after)
        os.killpg(p.pid, signal.SIGINT)
    try:
        _, stderr = p.communicate(timeout=60)
    finally:
        kill_group(p)
    assert p.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr
    deadline = time.monotonic() + 10
    while (left := group_alive(p.pid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert left == [], "processes left running after the stop"
    r = rerun("resume", job, env={"BATCHRUN_ECHO_DELAY_MS": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert sorted(x["custom_id"] for x in journal_records(job)) == sorted(
        f"r{i}" for i in range(3000)
    )


def test_an_actor_reports_its_engines_prefix_cache_counters(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The actor's body, in this process: each poll returns the engine's prefix-cache counters
    with what finished, as a local worker sends them (the parent turns them into the hit rate)."""
    import ray

    from batchrun.config import EngineSettings
    from batchrun.engines import base
    from batchrun.engines.echo import EchoEngine
    from batchrun.openai.records import CHAT, Request
    from batchrun.workers.messages import Cache, Ready
    from batchrun.workers.ray import EngineActor

    class CountingEcho(EchoEngine):
        """The echo engine with counters that grow by 10 lookups, 4 found, per request added."""

        looked = 0

        def add(self, request: Request) -> Any:
            self.looked += 1
            return super().add(request)

        def prefix_cache_counters(self) -> tuple[int, int]:
            return 10 * self.looked, 4 * self.looked

    monkeypatch.setattr(base, "create_engine", CountingEcho)
    # Where the actor runs: asked of Ray, which is not started here.
    monkeypatch.setattr(ray.util, "get_node_ip_address", lambda: "192.0.2.1")
    monkeypatch.setattr(ray, "get_gpu_ids", lambda: [])
    actor = EngineActor(EngineSettings(engine="echo").to_dict(), {})
    assert isinstance(actor.start(), Ready)
    body = {"messages": [{"role": "user", "content": "hi"}]}
    actor.add([Request(f"r{i}", i + 1, CHAT, body) for i in range(3)])
    done: list[Any] = []
    cache = None
    for _ in range(100):
        reply = actor.poll(0.05)
        assert reply.fatal is None
        done += reply.outcomes
        cache = reply.cache
        if len(done) == 3:
            break
    assert sorted(o.custom_id for o in done) == ["r0", "r1", "r2"]
    assert cache == Cache(queries=30, hits=12)


def test_a_hung_actor_is_replaced_and_a_stuck_request_times_out(tmp_path: Path) -> None:
    """Ray actors are watched as local workers are: one whose engine step never returns (after
    10 results) is killed past --stall-timeout and replaced; a request that never finishes is
    aborted past --request-timeout and fails with code `timeout`."""
    src = chat_input(tmp_path / "in.jsonl", 30)
    job = tmp_path / "job"
    r = submit_echo(
        src,
        job,
        "--batch-size",
        "4",
        "--ray",
        "local",
        "--workers",
        "1",
        "--stall-timeout",
        "3",
        "--request-timeout",
        "3",
        "--max-attempts",
        "1",
        env={"BATCHRUN_ECHO_HANG_AFTER": "10", "BATCHRUN_ECHO_HANG_ON": "r3"},
        timeout=300,
    )
    assert r.returncode == 1, r.stderr[-3000:]
    assert "hung: no result for 3 s" in r.stderr, r.stderr[-3000:]
    last = {rec["custom_id"]: rec for rec in journal_records(job)}
    assert sorted(last) == sorted(f"r{i}" for i in range(30))
    assert [cid for cid, rec in last.items() if not rec["ok"]] == ["r3"]
    assert last["r3"]["error"]["code"] == "timeout"


def test_several_models_on_ray_each_line_on_its_model(tmp_path: Path) -> None:
    """Two models on two Ray actors: they run at once, one actor each (run/lanes.py), every line
    answered once by the model it names (docs/several-models.md)."""
    lines = []
    for i in range(40):
        line = chat_line(f"r{i}", f"message {i}", max_tokens=4)
        line["body"]["model"] = "small" if i % 3 else "large"
        lines.append(line)
    src = write_jsonl(tmp_path / "in.jsonl", lines)
    job = tmp_path / "job"
    r = submit_echo(
        src, job, "--model", "small=org/small-model", "--model", "large=org/large-model", *RAY_TWO
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "running 2 models at once on 2 workers" in r.stderr, r.stderr[-3000:]
    got = answer_models(job)
    assert got == {f"r{i}": ("small" if i % 3 else "large") for i in range(40)}
    results = [x for x in journal_records(job) if x["kind"] == "result"]
    assert sorted(x["custom_id"] for x in results) == sorted(got)  # each once
    # Each actor ran one model's lines, the other's the other model's.
    by_worker: dict[int, set[str]] = {}
    for x in results:
        by_worker.setdefault(x["worker"], set()).add(x["model"])
    assert sorted(map(sorted, by_worker.values())) == [["large"], ["small"]]
    status = json.loads(cli("status", "--job-dir", str(job), "--json").stdout)
    assert {name: (m["requests"], m["completed"]) for name, m in status["models"].items()} == {
        "small": (26, 26),
        "large": (14, 14),
    }
