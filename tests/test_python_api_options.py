"""The Python API's options said as the CLI says them: every option whose value the CLI's parser
checks (a range, a list of choices), enumerated from the option table, refused by run,
Job.resume and Job.retry_failed in exactly the line `batchrun submit`, `resume` and
`retry-failed` print for the same value; and the metrics options (`metrics_port`,
`metrics_host`, `metrics_pushgateway`, `gpu_hour_cost`) run from Python as they do from the
CLI."""

from __future__ import annotations

import inspect
import json
import socket
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from support.api_jobs import api_process, chat_requests
from support.cli import cli
from support.jobs import submit_echo

import batchrun
from batchrun.metrics.exporter import DEFAULT_HOST
from batchrun.options.engine import ENGINE_OPTIONS
from batchrun.options.metrics import DEFAULT_METRICS_HOST, METRICS_OPTIONS
from batchrun.options.option import Option, is_choice

__all__ = ["api_process"]  # the fixture, used by name

ECHO: dict[str, Any] = {"engine": "echo", "progress": False}
CHECKED = [o for o in (*ENGINE_OPTIONS, *METRICS_OPTIONS) if o.checked_by_parser]
# The API's function against the CLI's command; the engine options replace the job's on the
# last two (no environment variable there), the metrics options never do.
COMMANDS = ["submit", "resume", "retry-failed"]


@pytest.fixture(autouse=True)
def _isolated(api_process: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)


def bad(option: Option) -> Any:
    """A value the option's parser refuses, of the type a Python caller would give."""
    if is_choice(option.type):
        return "nope"
    if option.min is not None:
        return option.type(option.min) - 1
    assert option.max is not None
    return option.type(option.max) + 1


def cli_line(command: str, option: Option, value: Any, job: Path) -> str:
    """The line the CLI prints for `--flag=value` (its error panel's text, at a width that
    keeps it on one line; the usage lines above it are decoration)."""
    where = [str(job / "in.jsonl")] if command == "submit" else ["--job-dir", str(job)]
    printed = cli(command, f"{option.flag}={value}", *where, env={"COLUMNS": "1000"})
    assert printed.returncode == 2, printed.stderr
    panel = [ln.strip("│ ") for ln in printed.stderr.splitlines() if ln.startswith("│")]
    assert len(panel) == 1, printed.stderr
    return panel[0]


def test_the_table_has_ranges_and_choices() -> None:
    """The comparison below covers what it should: every kind of check the parser makes."""
    names = {o.name for o in CHECKED}
    assert {"batch_size", "engine", "dtype", "order", "device", "metrics_port"} <= names
    assert "gpu_hour_cost" in names  # a float range
    assert DEFAULT_METRICS_HOST == DEFAULT_HOST  # the help's default is the one bound


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("option", CHECKED, ids=lambda o: o.name)
def test_a_value_the_parser_refuses_is_the_cli_line(
    tmp_path: Path, command: str, option: Option
) -> None:
    value = bad(option)
    job = tmp_path / "job"
    expected = cli_line(command, option, value, job)
    with pytest.raises(batchrun.BatchrunError) as raised:
        if command == "submit":
            batchrun.run(chat_requests(1), job_dir=job, **{**ECHO, option.name: value})
        elif command == "resume":
            batchrun.Job(job).resume(progress=False, **{option.name: value})
        else:
            batchrun.Job(job).retry_failed(progress=False, **{option.name: value})
    assert str(raised.value) == expected
    assert raised.value.exit_code == 2
    assert not job.exists()


def test_every_option_of_the_cli_is_the_apis() -> None:
    """The API takes each engine option of the table, and each metrics option, by name."""
    from batchrun.api import EngineOptions, run, submit

    assert set(EngineOptions.__annotations__) == {o.name for o in ENGINE_OPTIONS}
    for function in (run, submit, batchrun.Job.resume, batchrun.Job.retry_failed):
        params = inspect.signature(function).parameters
        assert {o.name for o in METRICS_OPTIONS} <= set(params), function


def test_gpu_hour_cost_prices_the_run_in_status(tmp_path: Path) -> None:
    """gpu_hour_cost: the run's time priced, in the job's status as the CLI's option prices it;
    a resume's run at its own rate."""
    job = batchrun.run(chat_requests(5), job_dir=tmp_path / "job", gpu_hour_cost=3600.0, **ECHO)
    manifest = json.loads((job.job_dir / "manifest.json").read_text(encoding="utf-8"))
    (run,) = manifest["runs"]
    assert run["usd_per_hour"] == 3600.0 and run["units"] == 1
    status = job.status()
    # 3600 USD an hour is a dollar a second: the cost is the run's seconds.
    assert status["cost"]["usd"] == pytest.approx(run["wall_s"], abs=1e-5)
    job.retry_failed(progress=False, gpu_hour_cost=7200)
    runs = json.loads((job.job_dir / "manifest.json").read_text(encoding="utf-8"))["runs"]
    assert [r["usd_per_hour"] for r in runs] == [3600.0, 7200.0]
    assert (
        batchrun.run(chat_requests(1), job_dir=tmp_path / "free", **ECHO).status()["cost"] is None
    )


def test_a_metrics_port_in_use_is_the_cli_line_and_makes_nothing(tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in chat_requests(1)), encoding="utf-8")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        printed = submit_echo(src, tmp_path / "cli", "--metrics-port", str(port), progress=True)
        assert printed.returncode == 2
        line = printed.stderr.strip().removeprefix("error: ")
        assert line == f"--metrics-port: port {port} on 127.0.0.1 is already in use; choose another"
        with pytest.raises(batchrun.BatchrunError) as raised:
            batchrun.run(chat_requests(1), job_dir=tmp_path / "job", metrics_port=port, **ECHO)
        assert str(raised.value) == line and raised.value.exit_code == 2
        with pytest.raises(batchrun.BatchrunError) as raised:
            batchrun.submit(src, job_dir=tmp_path / "job", metrics_port=port, **ECHO)
        assert str(raised.value) == line
    assert not (tmp_path / "job").exists() and not (tmp_path / "cli").exists()


def test_metrics_are_served_while_the_run_runs_and_the_port_freed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """metrics_port=0: a free port, said on stderr as the CLI says it, serving the run's
    metrics (scraped as soon as it is bound); given back when the call returns."""
    scraped: list[str] = []
    from batchrun.metrics import monitoring

    start = monitoring.Monitoring.start

    def start_and_scrape(self: Any, say: Any = None) -> Any:
        metrics = start(self, say)
        assert self.exporter is not None
        with urllib.request.urlopen(self.exporter.url, timeout=10) as page:
            scraped.append(page.read().decode())
        return metrics

    monkeypatch.setattr(monitoring.Monitoring, "start", start_and_scrape)
    job = batchrun.run(
        chat_requests(3), job_dir=tmp_path / "job", metrics_port=0, metrics_host="127.0.0.1",
        **ECHO,
    )  # fmt: skip
    said = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("metrics: ")]
    assert len(said) == 1 and said[0].startswith("metrics: http://127.0.0.1:")
    assert "batchrun_" in scraped[0]
    port = int(said[0].rsplit(":", 1)[1].split("/")[0])
    with socket.socket() as again:  # free again: a new /metrics could listen there
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the exporter does
        again.bind(("127.0.0.1", port))
        again.listen(1)
    assert job.status()["requests"]["succeeded"] == 3
