"""Prometheus metrics of a run (batchrun/metrics): scraped from a real `submit --metrics-port`
with prometheus_client's own parser, counters checked against the job, bad options refused."""

from __future__ import annotations

import json
import socket
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from support.cli import cli
from support.jobs import rerun, start_echo, submit_echo
from support.lines import write_jsonl
from support.paths import FAKE_NVML
from support.ports import free_port
from support.waits import wait_until

from batchrun.metrics import names
from batchrun.metrics.exporter import start_exporter
from batchrun.metrics.histogram import FastHistogram
from batchrun.metrics.recorder import CostMeter, RunMetrics


def completion(cid: str, max_tokens: int = 4) -> dict[str, Any]:
    """One /v1/completions line."""
    return {
        "custom_id": cid,
        "method": "POST",
        "url": "/v1/completions",
        "body": {"model": "m", "prompt": f"say {cid}", "max_tokens": max_tokens},
    }


def scrape(url: str) -> dict[str, Any]:
    """The page at `url` parsed as Prometheus does: {sample name with labels: value} and the
    families' names and types under "_types"."""
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    samples: dict[str, Any] = {}
    types: dict[str, str] = {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for s in family.samples:
            key = s.name + (
                "{" + ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())) + "}"
                if s.labels
                else ""
            )
            samples[key] = s.value
    samples["_types"] = types
    return samples


@pytest.mark.slow
def test_a_running_submit_is_scraped_and_its_counters_agree_with_the_job(tmp_path: Path) -> None:
    """`submit --metrics-port` serves /metrics while it runs (queue depth and in flight seen
    mid-run), and a scrape near the end agrees with `status` on every count."""
    lines = [completion(f"r{i}") for i in range(300)] + ["{not json"]
    inp = write_jsonl(tmp_path / "in.jsonl", lines)
    job = tmp_path / "job"
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    proc = start_echo(
        inp,
        job,
        "--batch-size",
        "8",
        "--metrics-port",
        str(port),
        "--max-attempts",
        "1",
        env={"BATCHRUN_ECHO_DELAY_MS": "40", "BATCHRUN_ECHO_FAIL": "r5,r6"},
    )
    try:
        seen: dict[str, Any] = {}

        def running() -> bool:
            try:
                seen.update(scrape(url))
            except OSError:
                return False
            return seen.get(names.IN_FLIGHT, 0) > 0 and seen.get(names.QUEUE_DEPTH, 0) > 0

        wait_until(running, "a scrape shows requests in flight and queued", timeout=60)
        types = seen["_types"]
        assert types["batchrun_requests"] == "counter"
        assert types["batchrun_request_latency_seconds"] == "histogram"
        assert types["batchrun_request_queue_seconds"] == "histogram"
        assert types[names.QUEUE_DEPTH] == types[names.IN_FLIGHT] == "gauge"
        assert seen[names.BATCH_SIZE] == 8
        assert seen[names.IN_FLIGHT] <= 16  # the window and its prefetch
        # No GPU here: the GPU families are absent, not zero.
        assert names.GPU_MEMORY not in types and names.GPU_UTILIZATION not in types
        last: dict[str, Any] = {}

        def nearly_done() -> bool:
            last.update(scrape(url))
            done = sum(
                last.get(f"batchrun_requests_total{{outcome={o}}}", 0)
                for o in ("succeeded", "failed")
            )
            return done >= 280

        wait_until(nearly_done, "a scrape shows 280 requests done", timeout=60)
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, err  # two failed, one invalid
    assert f"metrics: {url}" in err
    # Past the end nothing listens there any more.
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen(1)
    status = json.loads(cli("status", "--job-dir", str(job), "--json").stdout)
    # The last scrape is a lower bound; each counter only grows.
    assert last["batchrun_requests_total{outcome=failed}"] == status["requests"]["failed"] == 2
    assert last["batchrun_requests_total{outcome=invalid}"] == status["requests"]["invalid"] == 1
    assert last["batchrun_requests_total{outcome=succeeded}"] <= status["requests"]["succeeded"]
    assert last["batchrun_tokens_total{kind=completion}"] <= status["tokens"]["completion"]
    assert last["batchrun_request_latency_seconds_count"] >= 280
    # The echo engine's 40 ms per request is the least a dispatch-to-result latency can be.
    assert last["batchrun_request_latency_seconds_bucket{le=0.025}"] == 0


def test_counters_equal_the_job_at_the_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run in process: after the run, the exporter's counters are the job's own, including a
    retried request counted once, by its final outcome; tokens equal the journal's."""
    from batchrun.job.status import job_status
    from batchrun.run.jobs import RunOptions, submit

    inp = write_jsonl(
        tmp_path / "in.jsonl", [completion(f"r{i}", 3) for i in range(40)] + ["nope", "{}"]
    )
    monkeypatch.setenv("BATCHRUN_ECHO_FAIL", "r1,r2")  # fail on every attempt: retried twice
    metrics = RunMetrics()
    exporter = start_exporter(metrics, 0)
    try:
        options = RunOptions(batch_size=4, max_attempts=3, progress=False)
        options.settings.engine = "echo"
        submit(inp, tmp_path / "job", options, notify=lambda _: None, metrics=metrics)
        page = scrape(exporter.url)
    finally:
        exporter.close()
    status = job_status(tmp_path / "job")
    counts = status["requests"]
    assert page["batchrun_requests_total{outcome=succeeded}"] == counts["succeeded"] == 38
    assert page["batchrun_requests_total{outcome=failed}"] == counts["failed"] == 2
    assert page["batchrun_requests_total{outcome=invalid}"] == counts["invalid"] == 2
    assert page["batchrun_tokens_total{kind=completion}"] == status["tokens"]["completion"]
    assert page["batchrun_tokens_total{kind=prompt}"] == status["tokens"]["prompt"]
    # Every attempt has a latency: 38 + 2 * 3.
    assert page["batchrun_request_latency_seconds_count"] == 44
    assert page[names.IN_FLIGHT] == 0 and page[names.QUEUE_DEPTH] == 0


def test_an_out_of_memory_back_off_is_counted_with_its_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An engine that runs out of memory above 4 sequences: the run backs off 16 -> 8 -> 4, each
    a back-off and a restart with reason oom."""
    from batchrun.run.jobs import RunOptions, submit

    inp = write_jsonl(tmp_path / "in.jsonl", [completion(f"r{i}") for i in range(30)])
    monkeypatch.setenv("BATCHRUN_ECHO_OOM_ABOVE", "4")
    metrics = RunMetrics(gpus=False)
    options = RunOptions(batch_size=16, progress=False)
    options.settings.engine = "echo"
    submit(inp, tmp_path / "job", options, notify=lambda _: None, metrics=metrics)
    assert metrics.oom_backoffs == 2
    assert metrics.restarts == {"oom": 2}
    assert metrics.requests == {"succeeded": 30, "failed": 0, "invalid": 0}


def test_a_metrics_port_in_use_is_one_line_before_any_job(tmp_path: Path) -> None:
    """Exit 2, one line, and no job directory made."""
    inp = write_jsonl(tmp_path / "in.jsonl", [completion("a")])
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        r = submit_echo(inp, tmp_path / "job", "--metrics-port", str(port), progress=True)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == (
        f"error: --metrics-port: port {port} on 127.0.0.1 is already in use; choose another"
    )
    assert not (tmp_path / "job").exists()


def test_a_negative_gpu_hour_cost_is_refused(tmp_path: Path) -> None:
    """A usage error naming the option; nothing is made."""
    inp = write_jsonl(tmp_path / "in.jsonl", [completion("a")])
    r = submit_echo(
        inp, tmp_path / "job", "--gpu-hour-cost", "-1", env={"COLUMNS": "300"}, progress=True
    )
    assert r.returncode == 2
    assert "Invalid value for '--gpu-hour-cost'" in r.stderr
    assert "-1.0 is not in the range x>=0.0." in r.stderr
    assert not (tmp_path / "job").exists()


def test_the_cost_is_exported_and_kept_for_status(tmp_path: Path) -> None:
    """--gpu-hour-cost: the manifest keeps the run's rate and GPUs; status prices the run's wall
    time at it, and shows it per million tokens."""
    inp = write_jsonl(tmp_path / "in.jsonl", [completion(f"r{i}") for i in range(20)])
    r = submit_echo(inp, tmp_path / "job", "--gpu-hour-cost", "3600")
    assert r.returncode == 0, r.stderr
    runs = json.loads((tmp_path / "job" / "manifest.json").read_text())["runs"]
    assert len(runs) == 1 and runs[0]["usd_per_hour"] == 3600 and runs[0]["units"] == 1
    status = json.loads(cli("status", "--job-dir", str(tmp_path / "job"), "--json").stdout)
    # 3600 USD an hour is a dollar a second: the run's cost is its seconds.
    assert 0 < runs[0]["wall_s"] < 60 and status["wall_s"] == runs[0]["wall_s"]
    assert status["cost"]["usd"] == pytest.approx(runs[0]["wall_s"], abs=1e-5)
    tokens = status["tokens"]["prompt"] + status["tokens"]["completion"]
    assert status["cost"]["usd_per_million_tokens"] == pytest.approx(
        status["cost"]["usd"] / tokens * 1e6, rel=1e-4
    )


def test_the_cost_meter_counts_each_gpu() -> None:
    """Per GPU-hour: two GPUs cost twice one; a stopped meter stops."""
    meter = CostMeter(36.0)
    meter.start(2)
    time.sleep(0.2)
    meter.stop()
    spent = meter.usd()
    assert spent == pytest.approx(36.0 * 2 * 0.2 / 3600, rel=0.5)
    time.sleep(0.05)
    assert meter.usd() == spent


def test_fast_histogram_matches_prometheus_client() -> None:
    """The hot path's histogram exposes what prometheus_client's own would for the same values."""
    from prometheus_client import CollectorRegistry

    # On the bounds, between them, past the last; a few at a time and many (sorted) at once.
    values = [0.0, 0.004, 0.005, 0.0051, 0.3, 1.0, 2.4, 9999.0, 0.3]
    values += [b * f for b in names.LATENCY_BUCKETS for f in (0.5, 1.0, 1.01)]
    ours = FastHistogram("x_seconds", "x", names.LATENCY_BUCKETS)
    ours.observe_many(values[:4])
    for v in values[4:9]:
        ours.observe(v)
    ours.observe_many(values[9:])
    registry = CollectorRegistry()
    theirs = Histogram("x_seconds", "x", buckets=names.LATENCY_BUCKETS, registry=registry)
    for v in values:
        theirs.observe(v)
    [family] = [f for f in registry.collect() if f.name == "x_seconds"]
    expected = {
        (s.name, s.labels.get("le")): s.value for s in family.samples if "created" not in s.name
    }
    got = {(s.name, s.labels.get("le")): s.value for s in ours.family().samples}
    assert got.pop(("x_seconds_sum", None)) == pytest.approx(expected.pop(("x_seconds_sum", None)))
    assert got == expected


def test_latencies_binned_from_their_start_times_match_prometheus_client() -> None:
    """observe_since (the hot path's: `now - t` binned from the times t) counts each latency
    in the bucket prometheus_client's own histogram does, for a few values and for many. (A
    latency within float rounding of a bound may fall either side: `now - t <= b` and
    `t >= now - b` round apart there.)"""
    from prometheus_client import CollectorRegistry

    now = 1000.0
    latencies = [b * f for b in names.LATENCY_BUCKETS for f in (0.5, 0.999, 1.01)] + [0.0, 9e9]
    for chunk in (latencies[:3], latencies):
        ours = FastHistogram("x_seconds", "x", names.LATENCY_BUCKETS)
        ours.observe_since(now, [now - v for v in chunk])
        registry = CollectorRegistry()
        theirs = Histogram("x_seconds", "x", buckets=names.LATENCY_BUCKETS, registry=registry)
        for v in chunk:
            theirs.observe(now - (now - v))  # the same float rounding as ours
        [family] = [f for f in registry.collect() if f.name == "x_seconds"]
        expected = {
            (s.name, s.labels.get("le")): s.value for s in family.samples if "created" not in s.name
        }
        got = {(s.name, s.labels.get("le")): s.value for s in ours.family().samples}
        assert got.pop(("x_seconds_sum", None)) == pytest.approx(
            expected.pop(("x_seconds_sum", None)), rel=1e-9, abs=1e-6
        )
        assert got == expected


def _gpu_families(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> dict[str, Any]:
    from batchrun.metrics.gpu import GpuCollector

    monkeypatch.syspath_prepend(str(FAKE_NVML))
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return {f.name: f for f in GpuCollector().collect()}


def test_gpu_gauges_come_from_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fake pynvml with two GPUs: memory in bytes and utilization as a ratio, per GPU."""
    families = _gpu_families(monkeypatch, {"FAKE_NVML_GPUS": "2"})
    memory = {s.labels["gpu"]: s.value for s in families[names.GPU_MEMORY].samples}
    util = {s.labels["gpu"]: s.value for s in families[names.GPU_UTILIZATION].samples}
    assert memory == {"0": 1 * 2**30, "1": 2 * 2**30}
    assert util == {"0": 0.25, "1": 0.5}


@pytest.mark.parametrize(
    "env", [{"FAKE_NVML_GPUS": "0"}, {"FAKE_NVML_INIT_ERROR": "1"}], ids=["no-gpu", "no-driver"]
)
def test_gpu_gauges_are_absent_without_gpus(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str]
) -> None:
    """No GPU, or NVML that does not load: no GPU family at all (not zeros)."""
    assert _gpu_families(monkeypatch, env) == {}


def test_gpu_gauges_are_absent_without_pynvml(monkeypatch: pytest.MonkeyPatch) -> None:
    """nvidia-ml-py not installed: no GPU family."""
    from batchrun.metrics.gpu import GpuCollector

    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    assert list(GpuCollector().collect()) == []


def test_resume_and_retry_failed_serve_metrics_too(tmp_path: Path) -> None:
    """resume refuses a port in use (exit 2, one line, the job untouched); retry-failed takes
    the port from BATCHRUN_METRICS_PORT and says where it serves."""
    inp = write_jsonl(tmp_path / "in.jsonl", [completion(f"r{i}") for i in range(5)])
    job = tmp_path / "job"
    r = submit_echo(inp, job, env={"BATCHRUN_ECHO_FAIL": "r1"})
    assert r.returncode == 1, r.stderr
    manifest = (job / "manifest.json").read_bytes()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        r = cli("resume", "--job-dir", str(job), "--metrics-port", str(port))
    assert r.returncode == 2
    assert r.stderr.strip() == (
        f"error: --metrics-port: port {port} on 127.0.0.1 is already in use; choose another"
    )
    assert (job / "manifest.json").read_bytes() == manifest
    port = free_port()
    r = rerun("retry-failed", job, env={"BATCHRUN_METRICS_PORT": str(port)})
    assert r.returncode == 0, r.stderr
    assert f"metrics: http://127.0.0.1:{port}/metrics" in r.stderr.splitlines()


def test_answers_from_the_cache_are_counted(tmp_path: Path) -> None:
    """A second job over the same greedy lines with the same --cache-dir: every answer comes
    from the cache, and batchrun_cache_hits_total says how many, as status does."""
    from batchrun.job.status import job_status
    from batchrun.run.jobs import RunOptions, submit

    lines = [completion(f"r{i}") for i in range(12)]
    for line in lines:
        line["body"]["temperature"] = 0  # greedy: the cache keeps its answer
    inp = write_jsonl(tmp_path / "in.jsonl", lines)
    pages = []
    for name in ("first", "second"):
        metrics = RunMetrics(gpus=False)
        options = RunOptions(batch_size=4, progress=False)
        options.settings.engine = "echo"
        options.cache_dir = tmp_path / "cache"
        submit(inp, tmp_path / name, options, notify=lambda _: None, metrics=metrics)
        text = generate_latest(metrics.registry).decode()
        pages.append(
            {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
        )
    assert pages[0][names.CACHE_HITS] == 0
    assert pages[1][names.CACHE_HITS] == 12 == job_status(tmp_path / "second")["cache_hits"]


def test_every_family_is_there_from_the_first_scrape() -> None:
    """Before any run (a job validating, a server with no batch yet): the gauges read 0, serve's
    batches have every status at 0; only what needs a GPU, a cost or a time to first token
    waits for one."""
    from batchrun.serve.metrics import BATCH_STATUSES, Metrics

    for registry in (RunMetrics(gpus=False).registry, Metrics().run.registry):
        text = generate_latest(registry).decode()
        samples = {s.name: s for f in text_string_to_metric_families(text) for s in f.samples}
        for gauge in (names.QUEUE_DEPTH, names.IN_FLIGHT, names.BATCH_SIZE, names.CACHE_HITS):
            assert samples[gauge].value == 0, gauge
    serve = Metrics()
    serve.gauges = lambda: {"batches": {"completed": 2}}
    batches = {
        s.labels["status"]: s.value
        for f in text_string_to_metric_families(serve.render())
        for s in f.samples
        if s.name == names.BATCHES
    }
    assert batches == {**dict.fromkeys(BATCH_STATUSES, 0), "completed": 2}
    # The statuses are OpenAI's Batch object's, all of them.
    from typing import get_args

    from openai.types import Batch

    assert set(BATCH_STATUSES) == set(get_args(Batch.model_fields["status"].annotation))
