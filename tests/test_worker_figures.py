"""Per-worker figures and rates, as docs/metrics.md's glossary defines them: one fold
(job/tally.py) that status, status --json, the report page and /metrics all read, and rates
over run time, never over a pause between runs."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from support.cli import cli
from support.jobs import journal_records, rerun, start_echo, status_json, submit_echo
from support.lines import chat_line, write_jsonl
from support.waits import results_at_least, wait_until

from batchrun.job.figures import job_figures
from batchrun.job.manifest import load_manifest
from batchrun.job.paths import JobPaths
from batchrun.metrics import names
from batchrun.metrics.recorder import RunMetrics


def _input(tmp_path: Path, n: int, duplicates: int = 0) -> Path:
    """`n` chat lines, the last `duplicates` of them asking what an earlier one asks."""
    lines = [
        chat_line(f"r{i}", f"message {i}", max_tokens=8, temperature=0)
        for i in range(n - duplicates)
    ]
    lines += [
        chat_line(f"d{i}", f"message {i}", max_tokens=8, temperature=0) for i in range(duplicates)
    ]
    return write_jsonl(tmp_path / "in.jsonl", lines)


def _page_data(job: Path, tmp_path: Path) -> dict[str, Any]:
    page = tmp_path / "report.html"
    r = cli("report", "--job-dir", str(job), "--output", str(page))
    assert r.returncode == 0, r.stderr
    found = re.search(
        r'<script type="application/json" id="report-data">(.*?)</script>', page.read_text(), re.S
    )
    assert found is not None
    return json.loads(found.group(1))  # type: ignore[no-any-return]


def _scraped(job: Path) -> dict[str, dict[str, float]]:
    """The per-worker families of /metrics, as a job's exporter reads them (metrics/run.py)."""
    paths = JobPaths(job)
    manifest = load_manifest(paths)
    metrics = RunMetrics(gpus=False)
    metrics.job_figures = lambda: job_figures(paths, manifest, None, save=False)[0]
    text = generate_latest(metrics.registry).decode()
    found: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in (names.JOB_WORKER_ATTEMPTS, names.JOB_WORKER_TOKENS_PER_SECOND):
                found.setdefault(sample.name, {})[sample.labels["worker"]] = sample.value
    return found


@pytest.mark.slow
def test_two_workers_status_page_and_metrics_show_the_same_per_worker_figures(
    tmp_path: Path,
) -> None:
    # Enough work (about 3 s for one worker alone) that both workers are ready before the
    # other could finish it all.
    src = _input(tmp_path, 2000, duplicates=60)
    job = tmp_path / "job"
    r = submit_echo(
        src, job, "--workers", "2", "--batch-size", "16", env={"BATCHRUN_ECHO_DELAY_MS": "25"}
    )
    assert r.returncode == 0, r.stderr
    status = status_json(job)
    workers = status["workers"]
    assert [w["worker"] for w in workers] == [0, 1]
    # Copies of a duplicate's answer are no worker's attempts: the workers' add up to the
    # engine's, and those are every attempt less the copies.
    assert status["deduplicated"] == 60
    assert sum(w["requests"] for w in workers) == status["engine_attempts"] == 1940
    records = [x for x in journal_records(job) if "copy_of" not in x]
    for w in workers:
        mine = [x for x in records if x["worker"] == w["worker"]]
        assert w["requests"] == len(mine)
        assert w["completion_tokens"] == sum(x["completion_tokens"] for x in mine)
        assert (
            0
            < w["active_s"]
            <= max(x["time"] for x in mine) - min(x["time"] - x["latency_s"] for x in mine) + 1e-6
        )
        assert w["tokens_per_s"] == pytest.approx(w["completion_tokens"] / w["active_s"], rel=1e-3)
    # The page's workers are status's rows, figure for figure.
    page = _page_data(job, tmp_path)
    keys = ("worker", "requests", "completion_tokens", "active_s", "requests_per_s", "tokens_per_s")
    assert [{k: w[k] for k in keys} for w in page["workers"]] == [
        {k: w[k] for k in keys} for w in workers
    ]
    assert [w["attempts"] for w in page["workers"]] == [w["requests"] for w in workers]
    # And /metrics the same.
    scraped = _scraped(job)
    assert scraped[names.JOB_WORKER_ATTEMPTS] == {
        str(w["worker"]): float(w["requests"]) for w in workers
    }
    assert scraped[names.JOB_WORKER_TOKENS_PER_SECOND] == {
        str(w["worker"]): w["tokens_per_s"] for w in workers
    }
    # The table plain status prints shows the same figures.
    text = cli("status", "--job-dir", str(job)).stdout
    for w in workers:
        assert re.search(
            rf"worker {w['worker']}.*{w['requests']:,}.*{w['tokens_per_s']:,.1f}", text
        )


@pytest.mark.slow
def test_a_job_killed_and_resumed_after_a_pause_shows_its_runs_rate(tmp_path: Path) -> None:
    src = _input(tmp_path, 240)
    job = tmp_path / "job"
    env = {"BATCHRUN_ECHO_DELAY_MS": "100"}  # 4 at a time: 6 s of work
    p = start_echo(src, job, "--batch-size", "4", env=env)
    wait_until(results_at_least(job, 40), "40 results", timeout=60)
    first = min(x["time"] for x in journal_records(job))
    # Killed once the run clock has seen it after its first results (what the run keeps).
    clock = job / "run_clock.json"
    wait_until(lambda: json.loads(clock.read_text())["seen_at"] > first, "a clock", timeout=10)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    pause = 6.0
    time.sleep(pause)
    r = rerun("resume", job, env=env)
    assert r.returncode == 0, r.stderr
    status = status_json(job)
    assert status["requests"]["succeeded"] == 240 and status["runs"] == 2
    records = journal_records(job)
    first, last = min(x["time"] for x in records), max(x["time"] for x in records)
    wall = status["wall_s"]
    # The pause is in no figure: the run time is shorter than first-to-last result by it.
    assert wall < (last - first) - pause / 2
    t = status["throughput"]
    assert t["over"] == "runs" and t["seconds"] == wall
    assert t["requests_per_s"] == round(status["engine_attempts"] / wall, 2)
    assert t["requests_per_s"] > status["engine_attempts"] / (last - first) * 1.2
    # Nor in the worker's own active time.
    (worker,) = status["workers"]
    assert worker["active_s"] < (last - first) - pause / 2
    assert worker["requests"] == status["engine_attempts"]
