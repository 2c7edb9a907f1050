"""--metrics-pushgateway (batchrun/metrics/push.py): the run's metrics pushed as the job goes and
once after its last count; a gateway that is down, failing or hanging never stops or slows the
job (one warning line, pushes tried again); a URL that cannot be one is refused before any job."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.cli import cli
from support.jobs import rerun, submit_echo
from support.lines import completion_line, write_jsonl
from support.ports import free_port
from support.waits import wait_until

from batchrun.errors import OptionError
from batchrun.metrics.push import Pusher, gateway_url
from batchrun.metrics.recorder import RunMetrics


@dataclass
class Gateway:
    """A stand-in Pushgateway on 127.0.0.1: records each push (path, body) and answers `status`
    (or never answers while `hang` is set)."""

    status: int = 200
    hang: threading.Event = field(default_factory=threading.Event)
    pushes: list[tuple[str, str, str]] = field(default_factory=list)
    url: str = ""

    def last(self) -> dict[str, float]:
        """The last push's samples, as {name{labels}: value}."""
        _method, _path, body = self.pushes[-1]
        return {
            s.name + "".join(f"{{{k}={v}}}" for k, v in sorted(s.labels.items())): s.value
            for f in text_string_to_metric_families(body)
            for s in f.samples
        }


@pytest.fixture
def gateway() -> Iterator[Gateway]:
    """A Gateway served from a thread for the test."""
    state = Gateway()

    class Handler(BaseHTTPRequestHandler):
        def do_PUT(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0))).decode()
            state.pushes.append(("PUT", self.path, body))
            while state.hang.is_set():
                time.sleep(0.05)
            self.send_response(state.status)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_port}"
    yield state
    state.hang.clear()
    server.shutdown()
    server.server_close()


def test_the_last_push_holds_the_final_failures(tmp_path: Path, gateway: Gateway) -> None:
    """A job whose failures are final only after its retry passes: the push after the run holds
    them (the last result counted first), under /metrics/job/batchrun/job_id/<id>; exit code 1
    as without a gateway."""
    lines = [completion_line(f"r{i}", 3) for i in range(30)] + ["{not json"]
    inp = write_jsonl(tmp_path / "in.jsonl", lines)
    job = tmp_path / "job"
    host = gateway.url.removeprefix("http://")
    r = submit_echo(
        inp,
        job,
        "--max-attempts",
        "3",
        "--gpu-hour-cost",
        "1.5",
        env={"BATCHRUN_ECHO_FAIL": "r3,r4", "BATCHRUN_METRICS_PUSHGATEWAY": host},
    )
    assert r.returncode == 1, r.stderr
    assert f"metrics: pushing to http://{host} every 5s" in r.stderr.splitlines()
    assert "warning" not in r.stderr
    job_id = json.loads((job / "manifest.json").read_text())["job_id"]
    assert gateway.pushes and {p[:2] for p in gateway.pushes} == {
        ("PUT", f"/metrics/job/batchrun/job_id/{job_id}")
    }
    status = json.loads(cli("status", "--job-dir", str(job), "--json").stdout)
    last = gateway.last()
    assert last["batchrun_requests_total{outcome=failed}"] == status["requests"]["failed"] == 2
    assert last["batchrun_requests_total{outcome=succeeded}"] == status["requests"]["succeeded"]
    assert last["batchrun_requests_total{outcome=invalid}"] == 1
    assert last["batchrun_requests_in_flight"] == 0 and last["batchrun_queue_depth"] == 0
    assert last["batchrun_cost_usd_total"] > 0
    # Every attempt: 28 succeeded, 2 failed 3 times each.
    assert last["batchrun_request_latency_seconds_count"] == 34
    # retry-failed pushes into the job's group too, its run counted from zero as /metrics does.
    before = len(gateway.pushes)
    r = rerun("retry-failed", job, env={"BATCHRUN_METRICS_PUSHGATEWAY": gateway.url})
    assert r.returncode == 1, r.stderr  # the invalid line stays
    assert gateway.pushes[before][1] == f"/metrics/job/batchrun/job_id/{job_id}"
    last = gateway.last()
    assert last["batchrun_requests_total{outcome=succeeded}"] == 2
    assert last["batchrun_requests_total{outcome=failed}"] == 0
    # The job's own figures cover every run (job/figures.py): what status says after both.
    status = json.loads(cli("status", "--job-dir", str(job), "--json").stdout)
    for state in ("succeeded", "failed", "pending", "invalid"):
        assert last[f"batchrun_job_requests{{status={state}}}"] == status["requests"][state]
    assert last["batchrun_job_requests{status=succeeded}"] == 30
    assert last["batchrun_job_wall_seconds"] == pytest.approx(status["wall_s"], abs=0.01)
    assert last["batchrun_job_cost_usd"] == pytest.approx(status["cost"]["usd"], abs=1e-4)


def test_a_gateway_that_is_down_is_one_warning_and_changes_nothing(tmp_path: Path) -> None:
    """Nothing listens at the URL: the job runs to its end with its own exit code and summary,
    and says so once."""
    inp = write_jsonl(tmp_path / "in.jsonl", [completion_line(f"r{i}", 3) for i in range(20)])
    port = free_port()
    env = {"BATCHRUN_ECHO_FAIL": "r1"}
    r = submit_echo(inp, tmp_path / "job", "--metrics-pushgateway", f"127.0.0.1:{port}", env=env)
    plain = submit_echo(inp, tmp_path / "plain", env=env)
    assert r.returncode == plain.returncode == 1, r.stderr
    warnings = [line for line in r.stderr.splitlines() if line.startswith("warning")]
    assert warnings == [
        f"warning: --metrics-pushgateway: cannot push to http://127.0.0.1:{port} (Connection "
        "refused); the job goes on and pushes are tried again every 5s"
    ]
    status = json.loads(cli("status", "--job-dir", str(tmp_path / "job"), "--json").stdout)
    assert status["requests"]["succeeded"] == 19 and status["requests"]["failed"] == 1


def test_a_failing_gateway_is_warned_of_once_and_tried_again(gateway: Gateway) -> None:
    """HTTP 500 on every push: one warning however many pushes; once the gateway answers again,
    the next push goes through."""
    metrics = RunMetrics(gpus=False)
    metrics.job_id = "batch_x"
    warned: list[str] = []
    gateway.status = 500
    pusher = Pusher(gateway.url, metrics, warned.append, interval=0.05).start()
    try:
        wait_until(lambda: pusher.failures >= 4, "four pushes failed", timeout=30)
        assert warned == [
            f"warning: --metrics-pushgateway: cannot push to {gateway.url} (HTTP 500 Internal "
            "Server Error); the job goes on and pushes are tried again every 0.05s"
        ]
        gateway.status = 200
        wait_until(lambda: pusher.pushes >= 2, "pushes go through again", timeout=30)
    finally:
        pusher.close()
    assert len(warned) == 1


def test_a_hanging_gateway_costs_at_most_the_push_timeout(gateway: Gateway) -> None:
    """A gateway that takes the push and never answers: the push gives up after its timeout,
    off the caller's thread; closing (the final push) is bounded too."""
    metrics = RunMetrics(gpus=False)
    metrics.job_id = "batch_x"
    warned: list[str] = []
    gateway.hang.set()
    pusher = Pusher(gateway.url, metrics, warned.append, interval=0.05, timeout=0.3).start()
    wait_until(lambda: pusher.failures >= 1, "a push timed out", timeout=30)
    started = time.monotonic()
    pusher.close()
    assert time.monotonic() - started < 0.3 * 2 + 1.5
    assert len(warned) == 1 and "timed out" in warned[0], warned


def test_nothing_is_pushed_before_the_job_has_an_id(gateway: Gateway) -> None:
    """Before the run starts (the job not made yet) the group has no name: no push."""
    pusher = Pusher(gateway.url, RunMetrics(gpus=False), lambda _: None, interval=0.02).start()
    time.sleep(0.2)
    pusher.close()
    assert gateway.pushes == [] and pusher.failures == 0


@pytest.mark.parametrize(
    ("given", "url"),
    [
        ("127.0.0.1:9091", "http://127.0.0.1:9091"),
        ("gateway.example:9091/", "http://gateway.example:9091"),
        ("https://gw.example/prefix/", "https://gw.example/prefix"),
        ("http://[::1]:9091", "http://[::1]:9091"),
    ],
)
def test_a_url_without_scheme_gets_http(given: str, url: str) -> None:
    """host:port is http://host:port, as prometheus_client and curl read it."""
    assert gateway_url(given) == url


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("ftp://gw:9091", "must be an http:// or https:// URL, got 'ftp://gw:9091'"),
        ("http://", "names no host: 'http://' (e.g. http://127.0.0.1:9091)"),
        ("127.0.0.1:port", "not a URL: '127.0.0.1:port'"),
        ("http://gw:9091/?a=1", "takes no query or fragment: 'http://gw:9091/?a=1'"),
    ],
)
def test_a_url_that_cannot_be_a_gateway_is_refused(given: str, message: str) -> None:
    """A usage error naming the option."""
    with pytest.raises(OptionError) as caught:
        gateway_url(given)
    assert caught.value.options == ("--metrics-pushgateway",)
    assert str(caught.value) == message


def test_a_bad_gateway_url_is_one_line_before_any_job(tmp_path: Path) -> None:
    """Exit 2, one line, no job directory."""
    inp = write_jsonl(tmp_path / "in.jsonl", [completion_line("a", 3)])
    r = submit_echo(inp, tmp_path / "job", "--metrics-pushgateway", "ftp://gw:9091", progress=True)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == (
        "error: --metrics-pushgateway: must be an http:// or https:// URL, got 'ftp://gw:9091'"
    )
    assert not (tmp_path / "job").exists()
