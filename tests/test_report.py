"""`batchrun report`: one self-contained HTML page about a job, checked in a real headless
Chromium (tests/browser/check_page.js: @sparticuz/chromium driven by puppeteer-core, installed
with npm into the suite's cache on first use); its memory bounded on a large journal."""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.cli import cli
from support.jobs import submit_echo
from support.lines import completion_line, write_jsonl

pytestmark = pytest.mark.slow  # out of the fast tier: docs/development.md

CHECK_PAGE = Path(__file__).parent / "browser" / "check_page.js"
# The browser the check drives: a Chromium build npm ships (no system browser is needed).
BROWSER_PACKAGES = ("@sparticuz/chromium@147.0.0", "puppeteer-core@24.43.1")


@pytest.fixture(scope="session")
def browser_dir(request: pytest.FixtureRequest) -> Path:
    """A folder whose node_modules holds the browser packages: installed once into pytest's
    cache directory, under a lock (test processes may ask at once)."""
    npm = shutil.which("npm")
    assert npm is not None and shutil.which("node"), "node and npm are needed for the browser test"
    cache = getattr(request.config, "cache", None)  # None with -p no:cacheprovider
    folder = (
        Path(cache.mkdir("batchrun-browser"))
        if cache is not None
        else Path(tempfile.gettempdir()) / "batchrun-browser"
    )
    folder.mkdir(parents=True, exist_ok=True)
    marker = folder / "installed.json"
    with (folder / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not marker.exists() or json.loads(marker.read_text()) != list(BROWSER_PACKAGES):
            (folder / "package.json").write_text('{"private": true}\n')
            subprocess.run(
                [npm, "install", "--no-audit", "--no-fund", "--silent", *BROWSER_PACKAGES],
                cwd=folder,
                check=True,
                timeout=300,
            )
            marker.write_text(json.dumps(list(BROWSER_PACKAGES)))
    return folder


def open_in_browser(browser_dir: Path, page: Path, screenshot: Path | None = None) -> Any:
    """What headless Chromium saw opening `page` (see check_page.js)."""
    args = ["node", str(CHECK_PAGE), str(page), *([str(screenshot)] if screenshot else [])]
    # Chromium unpacks itself into TMPDIR: one folder per test process, so that two never
    # unpack over each other (pytest-xdist).
    tmp = browser_dir / f"tmp-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}"
    tmp.mkdir(exist_ok=True)
    env = {**os.environ, "NODE_PATH": str(browser_dir / "node_modules"), "TMPDIR": str(tmp)}
    r = subprocess.run(args, capture_output=True, text=True, env=env, timeout=180)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def busy_job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A finished echo job with a bit of everything: failures of two codes, invalid lines,
    out-of-memory back-offs (16 -> 8 -> 4) and the restarts they cost, a cost."""
    from batchrun.metrics.recorder import CostMeter, RunMetrics
    from batchrun.run.jobs import RunOptions, submit

    tmp = tmp_path_factory.mktemp("report")
    lines: list[Any] = [completion_line(f"r{i}", 4) for i in range(120)]
    lines += ["{broken", '{"custom_id": "no-body"}']
    inp = write_jsonl(tmp / "in.jsonl", lines)
    saved = dict(os.environ)
    os.environ.update(
        {
            "BATCHRUN_ECHO_OOM_ABOVE": "4",
            "BATCHRUN_ECHO_FAIL": "r7,r8",
            "BATCHRUN_ECHO_DELAY_MS": "5",
        }
    )
    try:
        metrics = RunMetrics(gpus=False)
        metrics.cost = CostMeter(10.0)
        options = RunOptions(batch_size=16, max_attempts=2, progress=False)
        options.settings.engine = "echo"
        submit(inp, tmp / "job", options, notify=lambda _: None, metrics=metrics)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    yield tmp / "job"


def test_report_writes_one_self_contained_page(busy_job: Path) -> None:
    """The CLI says where; the page holds its script and styles, loads nothing by URL, and
    carries the job's numbers."""
    r = cli("report", "--job-dir", str(busy_job))
    page = busy_job / "report.html"
    size = page.stat().st_size
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"report: {page} ({size / 1024:,.0f} KiB)"
    text = page.read_text()
    assert not re.search(r"<(script|img|link|iframe)[^>]+(src|href)=", text)
    assert "Content-Security-Policy" in text and "default-src 'none'" in text
    data = json.loads(re.search(r'id="report-data">(.*?)</script>', text).group(1))
    assert sum(data["errors"]["counts"]) == 2 * 2 + 2  # two requests failed twice; two lines
    assert set(data["errors"]["labels"]) >= {"invalid_json"}
    assert [b["y"] for b in data["batch"]["backoffs"]] == [8, 4]
    assert {x["reason"] for x in data["batch"]["restarts"]} == {"oom"}
    assert "r7" in text  # an example line of the engine's failures


def test_report_opens_in_headless_chromium(
    browser_dir: Path, busy_job: Path, tmp_path: Path
) -> None:
    """No console error, no request outside the file, and every chart has paint on it."""
    page = tmp_path / "page.html"
    assert cli("report", "--job-dir", str(busy_job), "--output", str(page)).returncode == 0
    seen = open_in_browser(browser_dir, page, tmp_path / "page.png")
    assert seen["consoleErrors"] == [] and seen["pageErrors"] == []
    assert seen["requests"] == [page.resolve().as_uri()]
    assert seen["chartsDrawn"] == len(seen["canvases"]) == 6
    assert all(c["painted"] > 1000 for c in seen["canvases"]), seen["canvases"]
    assert (tmp_path / "page.png").stat().st_size > 10_000


def test_a_broken_page_is_caught_by_the_browser_check(browser_dir: Path, tmp_path: Path) -> None:
    """The check can fail: a script error and a fetch outside the file are both seen."""
    page = tmp_path / "bad.html"
    page.write_text(
        "<!DOCTYPE html><html><body><img src='http://example.invalid/x.png'>"
        "<script>undefinedFunction()</script></body></html>"
    )
    seen = open_in_browser(browser_dir, page)
    assert any("undefinedFunction" in e for e in seen["pageErrors"])
    assert "http://example.invalid/x.png" in seen["requests"]
    assert seen["chartsDrawn"] == 0


def test_report_on_a_directory_that_is_not_a_job_is_one_line(tmp_path: Path) -> None:
    """Exit 1 and the reason, nothing written."""
    r = cli("report", "--job-dir", str(tmp_path))
    assert r.returncode == 1
    assert r.stderr.strip() == (
        f"error: no job at {tmp_path}: there is no manifest.json (start one with submit)"
    )
    assert not (tmp_path / "report.html").exists()


def write_journal(job: Path, template: Path, n: int) -> None:
    """A copy of job `template` whose journal holds `n` results over an hour (1 in 50 failed)."""
    shutil.copytree(template, job)
    start = json.loads((job / "manifest.json").read_text())["created_at"]
    ok = (
        '{{"kind":"result","custom_id":"r{i}","line":{line},"attempt":1,"ok":true,'
        '"status_code":200,"body":{{"id":"cmpl-{i}","choices":[{{"text":"{text}"}}]}},'
        '"error":null,"retryable":false,"prompt_tokens":5,"completion_tokens":7,'
        '"latency_s":{latency},"time":{time},"worker":{worker}}}\n'
    )
    failed = (
        '{{"kind":"result","custom_id":"r{i}","line":{line},"attempt":1,"ok":false,'
        '"status_code":500,"body":null,"error":{{"code":"code{code}","message":"{text}"}},'
        '"retryable":false,"prompt_tokens":5,"completion_tokens":0,'
        '"latency_s":{latency},"time":{time},"worker":{worker}}}\n'
    )
    text = "x" * 40
    with (job / "journal.jsonl").open("w") as f:
        f.writelines(
            (failed if i % 50 == 0 else ok).format(
                i=i,
                line=i + 1,
                text=text,
                code=i % 7,
                latency=0.01 + (i % 1000) / 1000,
                time=start + 3600 * i / n,
                worker=i % 4,
            )
            for i in range(n)
        )


# VmHWM (peak_rss_kib), not ru_maxrss: Linux carries ru_maxrss over from the process that started
# this one, here a pytest worker that may hold a vLLM engine.
MEASURE = """
import sys
from pathlib import Path
from batchrun.peak_memory import peak_rss_kib
from batchrun.report.data import gather
from batchrun.report.page import render
page = render(gather(Path(sys.argv[1]))).encode()
print(peak_rss_kib(), len(page))
"""


def test_report_memory_does_not_grow_with_the_journal(busy_job: Path, tmp_path: Path) -> None:
    """Ten times the requests (20,000 and 200,000): the same peak memory within a few MiB, a
    page of about the same size, far under 5 MB."""
    import sys

    peaks, sizes = [], []
    for n in (20_000, 200_000):
        job = tmp_path / f"job{n}"
        write_journal(job, busy_job, n)
        r = subprocess.run(
            [sys.executable, "-c", MEASURE, str(job)], capture_output=True, text=True, check=True
        )
        peak_kib, size = map(int, r.stdout.split())
        peaks.append(peak_kib)
        sizes.append(size)
    # Holding a mere 100 bytes per request would add 18 MiB.
    assert peaks[1] - peaks[0] < 8 * 1024, peaks
    assert sizes[1] < 5_000_000 and sizes[1] < sizes[0] * 1.2, sizes


@pytest.mark.slow
def test_the_page_data_is_strict_json_when_a_figure_overflows(tmp_path: Path) -> None:
    """A cost past the float range (--gpu-hour-cost 1.7e308 per million tokens) is null in the
    page's data, as in status --json: JSON.parse, and any strict parser, refuses Infinity."""
    src = write_jsonl(tmp_path / "in.jsonl", [completion_line(f"r{i}", 4) for i in range(3)])
    job = tmp_path / "job"
    r = submit_echo(src, job, "--gpu-hour-cost", "1.7e308")
    assert r.returncode == 0, r.stderr
    r = cli("report", "--job-dir", str(job))
    assert r.returncode == 0, r.stderr
    text = (job / "report.html").read_text(encoding="utf-8")
    raw = re.search(r'id="report-data">(.*?)</script>', text, re.S)
    assert raw is not None

    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} in the page's data")

    data = json.loads(raw.group(1), parse_constant=refuse)
    assert data["cost"]["usd_per_million_tokens"] is None
    status = json.loads(cli("status", "--job-dir", str(job), "--json").stdout)
    assert data["cost"] == status["cost"]
