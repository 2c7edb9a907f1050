"""A real Prometheus and a real Pushgateway (Debian's `prometheus` and `prometheus-pushgateway`,
installed by the suite when missing) watch a real echo job and a real `serve`, configured from the
repository's own deploy/grafana/prometheus.yml at a 1 s scrape interval: every panel query of
deploy/grafana/batchrun.json returns data, and after the job ends Prometheus still holds its final
counts, through the Pushgateway. Each panel is asked for the job's scrape alone and for the
Pushgateway alone (serve's batches: for serve).

Exempt, and checked to be so: the time-to-first-token panel (the echo engine measures no time to
first token, so the family is absent; vLLM's is tested in tests/test_metrics_ttft.py). The GPU
panels read a fake NVML (tests/support/fakes/nvml) on this machine without a GPU.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.cli import cli, start_cli
from support.jobs import submit_echo
from support.lines import write_jsonl
from support.paths import FAKE_NVML, ROOT
from support.ports import free_port
from support.waits import wait_until

DASHBOARD = ROOT / "deploy" / "grafana" / "batchrun.json"
EXAMPLE = ROOT / "deploy" / "grafana" / "prometheus.yml"
PACKAGES = ("prometheus", "prometheus-pushgateway")  # Debian's; their binaries have these names
TTFT_PANEL = "Time to first token p50 / p99"


def _install() -> str | None:
    """Install Debian's packages where they are missing (apt-get, as root or through sudo -n);
    why they cannot be, or None when they are there."""
    if all(shutil.which(p) for p in PACKAGES):
        return None
    apt = shutil.which("apt-get")
    if apt is None:
        return "apt-get is not on this machine"
    if os.geteuid() == 0:
        prefix: list[str] = []
    elif shutil.which("sudo") and subprocess.run(["sudo", "-n", "true"]).returncode == 0:
        prefix = ["sudo", "-n"]
    else:
        return "apt-get needs root, and this user is not root (nor has sudo without a password)"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    lock = ("-o", "DPkg::Lock::Timeout=600")  # another test process may be installing them
    for command in (
        [*prefix, apt, *lock, "update"],
        [*prefix, apt, *lock, "install", "-y", "--no-install-recommends", *PACKAGES],
    ):
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1200)
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:]
            return f"`{' '.join(command)}` failed ({done.returncode}): {' '.join(tail)}"
    missing = [p for p in PACKAGES if not shutil.which(p)]
    return f"installed, but {missing} not on PATH" if missing else None


@pytest.fixture(scope="session")
def prometheus_binaries() -> dict[str, str]:
    """The paths of `prometheus` and `prometheus-pushgateway`, installed if need be; the test
    is skipped, loudly, only where apt cannot install them."""
    why = _install()
    if why is not None:
        message = f"NOT TESTED against a real Prometheus: {why}"
        warnings.warn(message, pytest.PytestWarning, stacklevel=1)
        pytest.skip(message)
    return {p: str(shutil.which(p)) for p in PACKAGES}


def _get(url: str, timeout: float = 5) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return bytes(r.read())


def _ready(url: str) -> bool:
    try:
        _get(url, timeout=1)
        return True
    except OSError:
        return False


def _start(command: list[str], log: Path, ready: str) -> subprocess.Popen[bytes]:
    """Start a server (its output to `log`) and wait until `ready` answers."""
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)

    def up() -> bool:
        assert process.poll() is None, f"{command[0]} exited: {log.read_text()}"
        return _ready(ready)

    wait_until(up, f"{command[0]} answers {ready}", timeout=60, every=0.2)
    return process


def _stop(process: subprocess.Popen[Any]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class Prometheus:
    """A running Prometheus' HTTP API."""

    def __init__(self, url: str) -> None:
        self.url = url

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's series (now)."""
        return self._api("query", {"query": expr})

    def query_range(self, expr: str, start: float, end: float) -> list[dict[str, Any]]:
        """A range query at 1 s steps, as Grafana asks a panel's."""
        return self._api("query_range", {"query": expr, "start": start, "end": end, "step": 1})

    def _api(self, path: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        answer = json.loads(_get(url, timeout=30))
        assert answer["status"] == "success", answer
        return list(answer["data"]["result"])


def finite(result: list[dict[str, Any]]) -> list[float]:
    """Every value of a query's result that is a number (not NaN, not ±Inf)."""
    values = [v for series in result for v in series.get("values", [series.get("value")])]
    numbers = [float(v[1]) for v in values if v is not None]
    return [n for n in numbers if math.isfinite(n)]


def by_labels(result: list[dict[str, Any]], label: str) -> dict[str, float]:
    """An instant query's values by one label."""
    return {s["metric"].get(label, ""): float(s["value"][1]) for s in result}


@pytest.fixture
def stack(
    tmp_path: Path, prometheus_binaries: dict[str, str]
) -> Iterator[tuple[Prometheus, dict[str, int]]]:
    """A Pushgateway, an echo `serve` and a Prometheus scraping them and a job's port at 1 s, set
    up from deploy/grafana/prometheus.yml with this test's ports."""
    ports = {"job": free_port(), "gateway": free_port(), "serve": free_port()}
    processes: list[subprocess.Popen[Any]] = []
    try:
        gateway = f"127.0.0.1:{ports['gateway']}"
        processes.append(
            _start(
                # In memory only: Debian's build keeps its groups in one file for every gateway
                # of the machine (/var/lib/prometheus/pushgateway.data) by default.
                [prometheus_binaries["prometheus-pushgateway"], f"--web.listen-address={gateway}",
                 "--persistence.file="],
                tmp_path / "pushgateway.log",
                f"http://{gateway}/-/ready",
            )
        )  # fmt: skip
        serve = f"127.0.0.1:{ports['serve']}"
        processes.append(
            _start(
                [sys.executable, "-m", "batchrun", "serve", "--root", str(tmp_path / "root"),
                 "--port", str(ports["serve"]), "--engine", "echo"],
                tmp_path / "serve.log",
                f"http://{serve}/health",
            )
        )  # fmt: skip
        config = yaml.safe_load(EXAMPLE.read_text())
        config["global"]["scrape_interval"] = "1s"
        targets = {
            "batchrun-jobs": f"127.0.0.1:{ports['job']}",
            "batchrun-pushgateway": gateway,
            "batchrun-serve": serve,
        }
        for scrape in config["scrape_configs"]:
            scrape["static_configs"] = [{"targets": [targets[scrape["job_name"]]]}]
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
        web = f"127.0.0.1:{free_port()}"
        processes.append(
            _start(
                [prometheus_binaries["prometheus"],
                 f"--config.file={tmp_path / 'prometheus.yml'}",
                 f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address={web}"],
                tmp_path / "prometheus.log",
                f"http://{web}/-/ready",
            )
        )  # fmt: skip
        prometheus = Prometheus(f"http://{web}")
        # Prometheus hands its targets to the scrapers some 5 s after it starts (its discovery
        # manager's update interval): a short job would end before its first scrape.
        wait_until(
            lambda: prometheus.query('up{job=~"batchrun-serve|batchrun-pushgateway"} == 1')[1:],
            "Prometheus scraped serve and the Pushgateway",
            timeout=60,
            every=0.5,
        )
        yield prometheus, ports
    finally:
        for process in reversed(processes):
            _stop(process)


def panels() -> list[tuple[str, str]]:
    """(title, expression) of every target of every panel of the dashboard."""
    dashboard = json.loads(DASHBOARD.read_text())
    return [(p["title"], t["expr"]) for p in dashboard["panels"] for t in p.get("targets", [])]


def job_variable_all() -> str:
    """What the dashboard's $job is under "All"."""
    dashboard = json.loads(DASHBOARD.read_text())
    (variable,) = [v for v in dashboard["templating"]["list"] if v["name"] == "job"]
    return str(variable["allValue"])


def line(cid: str) -> dict[str, Any]:
    """A greedy /v1/completions line (so that --cache-dir keeps its answer)."""
    body = {"model": "m", "prompt": f"say {cid}", "max_tokens": 4, "temperature": 0}
    return {"custom_id": cid, "method": "POST", "url": "/v1/completions", "body": body}


def test_prometheus_sees_every_panel_and_keeps_the_final_counts(
    tmp_path: Path, stack: tuple[Prometheus, dict[str, int]]
) -> None:
    """An echo job (scraped at --metrics-port, pushing with --metrics-pushgateway) with answers
    from the cache, an out-of-memory back-off (a restart), failures final only after its retry
    pass, an invalid line and a cost; serve idle beside it."""
    prometheus, ports = stack
    lines = [line(f"r{i}") for i in range(240)]
    cache = tmp_path / "cache"
    warm = write_jsonl(tmp_path / "warm.jsonl", lines[:40])
    r = submit_echo(warm, tmp_path / "warm", "--cache-dir", str(cache))
    assert r.returncode == 0, r.stderr
    inp = write_jsonl(tmp_path / "in.jsonl", [*lines, "{not json"])
    job = tmp_path / "job"
    started = time.time()
    proc = start_cli(
        "submit", str(inp), "--job-dir", str(job), "--engine", "echo", "--no-progress",
        "--batch-size", "8", "--max-attempts", "2", "--cache-dir", str(cache),
        "--metrics-port", str(ports["job"]),
        "--metrics-pushgateway", f"127.0.0.1:{ports['gateway']}",  # no scheme: http
        "--gpu-hour-cost", "2.5",
        env={
            "BATCHRUN_ECHO_DELAY_MS": "250",  # 200 runs, 4 at once: ~13 s, 2 pushes as it runs
            "BATCHRUN_ECHO_FAIL": "r50,r150,r222",
            "BATCHRUN_ECHO_OOM_ABOVE": "4",
            "PYTHONPATH": os.pathsep.join([str(FAKE_NVML), os.environ.get("PYTHONPATH", "")]),
            "FAKE_NVML_GPUS": "1",
        },
    )  # fmt: skip
    try:
        wait_until(
            lambda: prometheus.query('batchrun_requests_in_flight{job="batchrun-jobs"} > 0'),
            "Prometheus scraped the running job with requests in flight",
            timeout=60,
            every=0.5,
        )
        _out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, err  # three failed, one invalid: the gateway changes nothing
    assert "warning" not in err, err
    status = json.loads(cli("status", "--job-dir", str(job), "--json").stdout)
    counts = status["requests"]
    assert (counts["failed"], counts["invalid"], counts["succeeded"]) == (3, 1, 237)
    job_id = json.loads((job / "manifest.json").read_text())["job_id"]
    pushed = f'job="batchrun",job_id="{job_id}"'

    # The job is gone (its target down, its scraped series stale), and Prometheus, scraping the
    # Pushgateway, still holds its final counts.
    def final() -> bool:
        gone = not prometheus.query('batchrun_requests_total{job="batchrun-jobs"}')
        held = by_labels(prometheus.query(f"batchrun_requests_total{{{pushed}}}"), "outcome")
        return gone and held.get("failed") == 3

    wait_until(final, "the job's series are stale and the pushed final counts scraped",
               timeout=60, every=0.5)  # fmt: skip
    assert prometheus.query('up{job="batchrun-jobs"}')[0]["value"][1] == "0"
    held = by_labels(prometheus.query(f"batchrun_requests_total{{{pushed}}}"), "outcome")
    assert held == {"succeeded": 237.0, "failed": 3.0, "invalid": 1.0}
    (hits,) = finite(prometheus.query(f"batchrun_cache_hits_total{{{pushed}}}"))
    assert hits == 40 == status["cache_hits"]
    restarts = by_labels(prometheus.query(f"batchrun_engine_restarts_total{{{pushed}}}"), "reason")
    assert restarts["oom"] >= 1
    (cost,) = finite(prometheus.query(f"batchrun_cost_usd_total{{{pushed}}}"))
    assert cost > 0
    # The job's own figures (job/figures.py), as status shows them.
    job_counts = by_labels(prometheus.query(f"batchrun_job_requests{{{pushed}}}"), "status")
    assert job_counts == {k: float(v) for k, v in counts.items() if k in job_counts}
    assert set(job_counts) == {"succeeded", "failed", "pending", "invalid"}
    (job_cost,) = finite(prometheus.query(f"batchrun_job_cost_usd{{{pushed}}}"))
    assert job_cost == pytest.approx(status["cost"]["usd"], abs=1e-4)
    # serve had every family from its first scrape, before any batch.
    for family in ("batchrun_requests_in_flight", "batchrun_batch_size", "batchrun_batches"):
        assert prometheus.query(f'{family}{{job="batchrun-serve"}}'), family

    # Every panel of the dashboard, over the job's time, for each $job on its own: the job's
    # scrape, the Pushgateway, serve (its batches); under "All", time to first token has none.
    end = time.time()

    def data(expr: str, job_value: str) -> list[float]:
        return finite(prometheus.query_range(expr.replace("$job", job_value), started - 5, end))

    for title, expr in panels():
        if title == TTFT_PANEL:
            assert not data(expr, job_variable_all()), f"{title} has data: drop its exemption"
            continue
        serve_only = title.startswith("Batches by status")
        for job_value in ("batchrun-serve",) if serve_only else ("batchrun-jobs", "batchrun"):
            assert data(expr, job_value), f"{title} ($job={job_value}): no data for {expr!r}"
