"""batchrun from Python (batchrun/api/) on the echo engine, in this process: a job made and run
from request dicts, a DataFrame or a Table; its status exactly `status --json`; its results the
rows of results.parquet; options checked by the core's checks, a bad one refused with the CLI's
line before anything is made; and the same job directories as the CLI's, continued either way."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support.api_jobs import answered, api_process, chat_requests, input_lines
from support.cli import cli
from support.jobs import rerun
from support.lines import write_jsonl
from support.paths import ROOT
from support.processes import kill_9_after
from support.waits import results_at_least, wait_until

import batchrun
from batchrun.api.options import ENGINE_OPTIONS, EngineOptions

__all__ = ["api_process"]  # the fixture, used by name

ECHO: dict[str, Any] = {"engine": "echo", "progress": False}


@pytest.fixture(autouse=True)
def _isolated(api_process: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # a job given no job_dir goes under ./jobs


def test_run_makes_a_job_and_answers_every_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BATCHRUN_ECHO_FAIL", "r3")
    requests: list[Any] = [*chat_requests(6), '{"custom_id": "broken"']
    job = batchrun.run(
        iter(requests), job_dir=tmp_path / "job", batch_size=4, max_attempts=1, **ECHO
    )
    assert isinstance(job, batchrun.Job) and job.job_dir == tmp_path / "job"
    # The requests streamed into the job's input file, one line each, in order.
    assert [json.loads(x) for x in input_lines(job.job_dir)[:6]] == requests[:6]
    assert input_lines(job.job_dir)[6] == requests[6]
    status = job.status()
    assert status["status"] == "completed"
    assert status["requests"] == {
        "total": 7, "valid": 6, "succeeded": 5, "failed": 1, "invalid": 1, "pending": 0,
    }  # fmt: skip
    # Exactly `status --json`.
    printed = cli("status", "--job-dir", str(job.job_dir), "--json")
    assert printed.returncode == 0, printed.stderr
    assert status == json.loads(printed.stdout)

    table = job.results()
    assert isinstance(table, pa.Table)
    exported = cli("export", "--job-dir", str(job.job_dir), "--parquet")
    assert exported.returncode == 0, exported.stderr
    assert table.equals(pq.read_table(job.job_dir / "results.parquet"))
    frame = job.to_pandas()
    assert dict(zip(frame["custom_id"].fillna("-"), frame["status"], strict=True)) == {
        **{f"r{i}": "succeeded" for i in range(6) if i != 3},
        "r3": "failed",
        "-": "invalid",
    }

    summary = job.export()
    assert summary.paths == (job.job_dir / "output.jsonl", job.job_dir / "errors.jsonl")
    assert (summary.succeeded, summary.failed, summary.invalid) == (5, 1, 1)
    report = job.report(tmp_path / "page.html")
    assert report == tmp_path / "page.html" and "<html" in report.read_text(encoding="utf-8")

    monkeypatch.delenv("BATCHRUN_ECHO_FAIL")
    assert job.retry_failed(progress=False) is job
    assert job.status()["requests"]["failed"] == 0
    assert answered(job.job_dir) == {f"r{i}": 1 for i in range(6)}


def test_a_dataframe_and_a_table_give_one_request_per_row(tmp_path: Path) -> None:
    import pandas as pd

    requests = chat_requests(5)
    for name, given in (
        ("frame", pd.DataFrame(requests)),
        ("table", pa.Table.from_pylist(requests)),
    ):
        job = batchrun.run(given, job_dir=tmp_path / name, **ECHO)
        assert [json.loads(line) for line in input_lines(job.job_dir)] == requests
        assert job.status()["requests"]["succeeded"] == 5


def test_a_job_given_no_job_dir_goes_under_jobs(tmp_path: Path) -> None:
    job = batchrun.run(chat_requests(2), **ECHO)
    assert job.job_dir.parent == Path("jobs") and job.job_dir.name.startswith("run-")
    assert (tmp_path / job.job_dir / "manifest.json").exists()
    src = write_jsonl(tmp_path / "batch.jsonl", chat_requests(2))
    assert batchrun.submit(src, **ECHO).job_dir == Path("jobs/batch")


# (options, the CLI's line): the parser's (a type, range, choice or the option's own check) or the
# core's (options together); tests/test_python_api_options.py compares each range and choice of
# the option table with what the CLI prints.
BAD_OPTIONS: list[tuple[dict[str, Any], str]] = [
    (
        {"batch_size": 0},
        "Invalid value for '--batch-size' (env var: 'BATCHRUN_BATCH_SIZE'): 0 is not in the "
        "range 1<=x<=2048.",
    ),
    (
        {"dtype": "banana"},
        "Invalid value for '--dtype' (env var: 'BATCHRUN_DTYPE'): 'banana' is not one of "
        "'auto', 'half', 'float16', 'bfloat16', 'float', 'float32'.",
    ),
    (
        {"min_batch_size": 64, "max_batch_size": 8},
        "Invalid value for '--min-batch-size' / '--max-batch-size': the lower bound 64 is above "
        "the upper bound 8",
    ),
    (
        {"gpu_memory_utilization": 1.5},
        "Invalid value for '--gpu-memory-utilization' (env var: "
        "'BATCHRUN_GPU_MEMORY_UTILIZATION'): must be above 0 and at most 1, got 1.5",
    ),
    (
        {"gpus": "a,b"},
        "Invalid value for '--gpus' (env var: 'BATCHRUN_GPUS'): takes GPU indices or UUIDs "
        "separated by commas (e.g. 0,1,2,3), got 'a,b'",
    ),
    (
        {"gpus": [0, 0]},
        "Invalid value for '--gpus' (env var: 'BATCHRUN_GPUS'): names GPU 0 more than once",
    ),
    (
        {"stall_timeout": 1.0},
        "Invalid value for '--stall-timeout' (env var: 'BATCHRUN_STALL_TIMEOUT'): must be at "
        "least 2, got 1.0",
    ),
    (
        {"gpu_hour_cost": float("inf")},
        "Invalid value for '--gpu-hour-cost' (env var: 'BATCHRUN_GPU_HOUR_COST'): must be a "
        "finite number of USD, got inf",
    ),
    (
        {"metrics_pushgateway": "ftp://gateway"},
        "--metrics-pushgateway: must be an http:// or https:// URL, got 'ftp://gateway'",
    ),
    # A value the CLI's parser could never be given: refused in the same form.
    (
        {"batch_size": "8"},
        "Invalid value for '--batch-size' (env var: 'BATCHRUN_BATCH_SIZE'): must be an "
        "integer, got '8'",
    ),
    (
        {"enforce_eager": 1},
        "Invalid value for '--enforce-eager' (env var: 'BATCHRUN_ENFORCE_EAGER'): must be true "
        "or false, got 1",
    ),
    (
        {"revision": 3},
        "Invalid value for '--revision' (env var: 'BATCHRUN_REVISION'): must be a string, got 3",
    ),
    (
        {"metrics_port": 9400.0},
        "Invalid value for '--metrics-port' (env var: 'BATCHRUN_METRICS_PORT'): must be an "
        "integer, got 9400.0",
    ),
]


@pytest.mark.parametrize(("options", "line"), BAD_OPTIONS)
def test_a_bad_option_raises_the_cli_line_and_makes_nothing(
    tmp_path: Path, options: dict[str, Any], line: str
) -> None:
    given = {"engine": "echo", **options}
    job = tmp_path / "job"
    with pytest.raises(batchrun.BatchrunError) as raised:
        batchrun.run(chat_requests(1), job_dir=job, progress=False, **given)
    assert str(raised.value) == line
    assert not job.exists()
    src = write_jsonl(tmp_path / "in.jsonl", chat_requests(1))
    with pytest.raises(batchrun.BatchrunError) as raised:
        batchrun.submit(src, job_dir=job, progress=False, **given)
    assert str(raised.value) == line
    assert not job.exists()


@pytest.mark.parametrize(
    "options",
    [
        {"min_batch_size": 64, "max_batch_size": 8},
        {"gpu_memory_utilization": 1.5},
        {"gpus": "a,b"},
        {"stall_timeout": 1.0},
    ],
)
def test_resume_refuses_as_the_cli_resume_does(tmp_path: Path, options: dict[str, Any]) -> None:
    """Where the CLI's own line comes from the core's check (resume's engine options have no
    environment twin to name), the API's is the same, word for word."""
    job = batchrun.run(chat_requests(2), job_dir=tmp_path / "job", **ECHO)
    before = (job.job_dir / "manifest.json").read_bytes()
    flags = [f for name, value in options.items() for f in (_flag(name), str(value))]
    printed = cli("resume", "--job-dir", str(job.job_dir), *flags, env={"COLUMNS": "1000"})
    assert printed.returncode == 2
    cli_line = " ".join(ln.strip("│ ") for ln in printed.stderr.splitlines() if ln.startswith("│"))
    with pytest.raises(batchrun.BatchrunError) as raised:
        job.resume(progress=False, **options)
    assert str(raised.value) == cli_line
    assert (job.job_dir / "manifest.json").read_bytes() == before


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def test_an_unknown_option_is_a_type_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(
        TypeError, match=r"^run\(\) got an unexpected keyword argument 'batchsize'$"
    ):
        batchrun.run(chat_requests(1), job_dir=tmp_path / "job", batchsize=8, **ECHO)  # type: ignore[call-arg]
    assert not (tmp_path / "job").exists()
    job = batchrun.run(chat_requests(1), job_dir=tmp_path / "ok", **ECHO)
    with pytest.raises(TypeError, match="'no_progress'"):
        job.resume(no_progress=True)  # type: ignore[call-arg]


def test_the_options_are_the_engine_options_of_the_cli() -> None:
    """EngineOptions (the keyword arguments' types) lists every engine option the core takes."""
    assert set(EngineOptions.__annotations__) == set(ENGINE_OPTIONS)


def test_a_job_dir_that_holds_a_job_is_refused_and_left_alone(tmp_path: Path) -> None:
    job = batchrun.run(chat_requests(2), job_dir=tmp_path / "job", **ECHO)
    before = (job.job_dir / "requests.jsonl").read_bytes()
    with pytest.raises(batchrun.BatchrunError) as raised:
        batchrun.run(chat_requests(3, "x"), job_dir=job.job_dir, **ECHO)
    assert str(raised.value) == (
        f"a job already exists in {job.job_dir}; continue it with `batchrun resume --job-dir "
        f"{job.job_dir}`, or choose another --job-dir"
    )
    assert (job.job_dir / "requests.jsonl").read_bytes() == before
    # A directory with a file of that name in it, no job: the file is not written over.
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "requests.jsonl").write_text("my own\n")
    with pytest.raises(batchrun.BatchrunError, match=r"requests\.jsonl exists already"):
        batchrun.run(chat_requests(1), job_dir=mine, **ECHO)
    assert (mine / "requests.jsonl").read_text() == "my own\n"


def test_a_request_no_json_holds_is_refused_and_nothing_is_left(tmp_path: Path) -> None:
    requests: list[Any] = [*chat_requests(2), {"custom_id": "x", "body": object()}]
    with pytest.raises(batchrun.BatchrunError, match=r"^request 3 cannot be written as JSON"):
        batchrun.run(requests, job_dir=tmp_path / "job", **ECHO)
    assert not (tmp_path / "job").exists()
    with pytest.raises(TypeError, match="not a dict"):
        batchrun.run(chat_requests(1)[0], job_dir=tmp_path / "job", **ECHO)
    with pytest.raises(
        batchrun.BatchrunError, match=r"^no requests were given: a job needs at least one$"
    ):
        batchrun.run(iter([]), job_dir=tmp_path / "job", **ECHO)
    assert not (tmp_path / "job").exists()


def test_a_job_of_the_cli_is_resumed_from_python(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", chat_requests(100))
    # tune makes the job and only searches its batch size (its probe runs 16 requests at size
    # 8): resume runs the rest.
    size = ["--min-batch-size", "8", "--max-batch-size", "8"]
    tuned = cli("tune", str(src), "--job-dir", str(tmp_path / "job"), "--engine", "echo", *size)
    assert tuned.returncode == 0, tuned.stderr
    job = batchrun.Job(tmp_path / "job")
    assert job.status()["requests"]["pending"] > 0
    job.resume(progress=False)
    assert job.status()["status"] == "completed"
    assert answered(job.job_dir) == {f"r{i}": 1 for i in range(100)}


def _ctrl_c_once_journaled(job: Path, records: int, call: Callable[[], object]) -> None:
    """Run `call` under Python's own Ctrl-C handler (a notebook kernel's; a test runner may have
    changed it) and SIGINT this process once the job's journal holds `records` records: the
    KeyboardInterrupt must come out of `call`."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)

    def interrupt_once_journaled() -> None:
        wait_until(results_at_least(job, records), f"{records} records journaled", timeout=60)
        os.kill(os.getpid(), signal.SIGINT)

    stopper = threading.Thread(target=interrupt_once_journaled, daemon=True)
    stopper.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            call()
    finally:
        stopper.join(timeout=5)
        signal.signal(signal.SIGINT, previous)


@pytest.mark.slow
def test_ctrl_c_stops_a_python_run_and_the_cli_resumes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ctrl-C (SIGINT, a KeyboardInterrupt in the main thread) stops the job as the CLI's does,
    and goes on to the caller; the CLI's resume finishes it, each request answered once."""
    monkeypatch.setenv("BATCHRUN_ECHO_DELAY_MS", "200")
    job = tmp_path / "job"
    _ctrl_c_once_journaled(
        job, 4, lambda: batchrun.run(chat_requests(60), job_dir=job, batch_size=2, **ECHO)
    )
    assert capsys.readouterr().err.endswith(
        "\ninterrupted: the journal is flushed; nothing finished is lost. Continue with: "
        f"batchrun.Job({str(job)!r}).resume(), or batchrun resume --job-dir {job}\n"
    )
    status = batchrun.Job(job).status()
    assert status["status"] == "interrupted" and status["requests"]["pending"] > 0
    resumed = rerun("resume", job, env={"BATCHRUN_ECHO_DELAY_MS": "0"})
    assert resumed.returncode == 0, resumed.stderr
    assert answered(job) == {f"r{i}": 1 for i in range(60)}


@pytest.mark.slow
def test_ctrl_c_in_a_python_retry_failed_says_to_retry_failed_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A retry_failed stopped by Ctrl-C leaves failures that only retry-failed runs again (resume
    would run nothing): its advice names it, from Python and the CLI, and following it
    finishes the job."""
    job = tmp_path / "job"
    failing = [f"r{i}" for i in range(0, 60, 2)]
    monkeypatch.setenv("BATCHRUN_ECHO_FAIL", ",".join(failing))
    batchrun.run(chat_requests(60), job_dir=job, max_attempts=1, **ECHO)
    assert batchrun.Job(job).status()["requests"]["failed"] == 30
    monkeypatch.delenv("BATCHRUN_ECHO_FAIL")
    monkeypatch.setenv("BATCHRUN_ECHO_DELAY_MS", "200")
    _ctrl_c_once_journaled(
        job, 64, lambda: batchrun.Job(job).retry_failed(batch_size=2, progress=False)
    )
    assert capsys.readouterr().err.endswith(
        "\ninterrupted: the journal is flushed; nothing finished is lost. Continue with: "
        f"batchrun.Job({str(job)!r}).retry_failed(), or batchrun retry-failed --job-dir {job}\n"
    )
    monkeypatch.setenv("BATCHRUN_ECHO_DELAY_MS", "0")
    assert batchrun.Job(job).status()["requests"]["failed"] > 0
    batchrun.Job(job).retry_failed(progress=False)
    assert batchrun.Job(job).status()["requests"]["succeeded"] == 60


def test_import_batchrun_imports_no_engine_nor_dataframes() -> None:
    heavy = ["vllm", "torch", "pandas", "pyarrow", "numpy", "typer", "batchrun.api"]
    code = (
        f"import json, sys, batchrun; print(json.dumps([m for m in {heavy!r} if m in sys.modules]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True
    )
    assert json.loads(out.stdout) == []


def test_run_is_the_api_and_batchrun_run_the_core_package_still(tmp_path: Path) -> None:
    """batchrun/run/ (the core) and batchrun.run (the API's function) share a name: importing
    the core package leaves the name the API's, and dotted paths still reach the core."""
    import batchrun.run.jobs as core_jobs
    from batchrun import run

    assert callable(run) and run.__doc__ == batchrun.api.run.__doc__
    assert batchrun.run.jobs is core_jobs is sys.modules["batchrun.run.jobs"]
    assert (
        batchrun.run(chat_requests(1), job_dir=tmp_path / "job", **ECHO).status()["requests"][
            "succeeded"
        ]
        == 1
    )


def test_a_notebook_gets_the_notebook_bar(monkeypatch: pytest.MonkeyPatch) -> None:
    from batchrun.console import progress

    class ZMQInteractiveShell:  # what a Jupyter kernel's get_ipython() returns
        pass

    fake = type(sys)("IPython")
    fake.get_ipython = ZMQInteractiveShell  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "IPython", fake)
    assert progress.in_notebook()
    drawn: list[Any] = []

    class Bar(progress.tqdm):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            drawn.append(kwargs)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(progress, "notebook_bar", lambda: Bar)
    progress.ProgressReporter(total=3).close()  # stderr is no terminal here, as in a kernel
    progress.ProgressReporter(total=3, enabled=False).close()
    assert [kwargs["disable"] for kwargs in drawn] == [False, True]
    monkeypatch.delitem(sys.modules, "IPython")
    assert not progress.in_notebook()


SCRIPT = """
import sys
import batchrun

def requests(count):
    for i in range(count):
        body = {"model": "m", "messages": [{"role": "user", "content": f"say {i}"}], "max_tokens": 4}
        yield {"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}

def main():
    batchrun.run(requests(int(sys.argv[2])), job_dir=sys.argv[1], engine="echo", batch_size=4,
                 progress=False)
"""
KILLED_RUN = SCRIPT + 'if __name__ == "__main__":\n    main()\n'
# No guard, two workers, and a line the top level prints each time it runs.
UNGUARDED = SCRIPT.replace(
    "    batchrun.run(", "    print('top level', flush=True)\n    batchrun.run("
)
UNGUARDED += "main()\nprint(batchrun.Job(sys.argv[1]).status()['requests']['succeeded'])\n"


@pytest.mark.parametrize("how", ["file", "stdin"])
def test_a_script_without_the_main_guard_or_from_stdin_runs_its_job_once(
    tmp_path: Path, how: str
) -> None:
    """multiprocessing's spawn runs the script that started a process again in each child (its
    top level, where no `if __name__ == "__main__":` guards it), and a script read from stdin
    not at all (the child dies looking for a file `<stdin>`): batchrun's workers are spawned
    without it, so both run their job once and the top level once."""
    script = tmp_path / "unguarded.py"
    script.write_text(UNGUARDED.replace("batch_size=4,", "batch_size=4, workers=2,"), "utf-8")
    job = tmp_path / "job"
    argv = [str(script)] if how == "file" else ["-"]
    ran = subprocess.run(
        [sys.executable, *argv, str(job), "30"],
        stdin=script.open("rb") if how == "stdin" else subprocess.DEVNULL,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert ran.stdout.splitlines() == ["top level", "30"], ran.stdout
    # Both spawned, neither died (the second may start after the last answer: its "ready" then
    # goes unsaid).
    assert ran.stderr.count("starting echo engine") == 2, ran.stderr[-3000:]
    assert "could not start" not in ran.stderr and "Traceback" not in ran.stderr, ran.stderr
    assert answered(job) == {f"r{i}": 1 for i in range(30)}


@pytest.mark.slow
def test_a_python_run_killed_9_is_finished_by_resume_exactly_once(tmp_path: Path) -> None:
    """A Python process running a job, SIGKILLed in its middle (workers and all): `Job.resume()`
    runs what it had not finished, and every request is answered once."""
    script = tmp_path / "killed_run.py"
    script.write_text(KILLED_RUN, encoding="utf-8")
    job, count = tmp_path / "job", 80
    proc = subprocess.Popen(
        [sys.executable, str(script), str(job), str(count)],
        cwd=ROOT,
        env={**os.environ, "BATCHRUN_ECHO_DELAY_MS": "100"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own group: the kill takes its workers too
    )
    kill_9_after(proc, job, 10, timeout=60)
    assert proc.returncode == -signal.SIGKILL
    killed = batchrun.Job(job)
    assert 0 < len(answered(job)) < count, killed.status()["requests"]
    killed.resume(progress=False)
    assert killed.status()["requests"]["succeeded"] == count
    assert answered(job) == {f"r{i}": 1 for i in range(count)}
    ids = [
        json.loads(line)["custom_id"] for line in killed.export().paths[0].read_text().splitlines()
    ]
    assert sorted(ids) == sorted(f"r{i}" for i in range(count))


def test_a_script_without_the_main_guard_is_told_what_to_do(tmp_path: Path) -> None:
    """multiprocessing's spawn runs a script's top level again in each worker it starts (from
    its _fixup_main_from_path): a run started there is refused, saying what the script lacks,
    before anything is made."""

    def _fixup_main_from_path() -> None:  # the frame a spawned worker runs the script in
        batchrun.run(chat_requests(1), job_dir=tmp_path / "job", **ECHO)

    with pytest.raises(RuntimeError) as raised:
        _fixup_main_from_path()
    assert str(raised.value) == (
        "batchrun ran again inside one of its worker processes, which import the script that "
        'started it: call batchrun under `if __name__ == "__main__":` (as any code that starts '
        "processes must; a notebook needs nothing)"
    )
    assert not (tmp_path / "job").exists()


@pytest.mark.slow
def test_the_import_benchmark_measures_and_sees_no_heavy_module() -> None:
    """scripts/bench.py import, one round: `import batchrun` left none of the watched modules."""
    ran = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench.py"), "import", "--runs", "1", "--no-docs"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert ran.returncode == 0, ran.stderr
    [row] = [line for line in ran.stdout.splitlines() if line.startswith("  `import batchrun` ")]
    assert row.split()[-1] == "none", row


def test_the_reference_in_docs_python_md_is_the_docstrings() -> None:
    ran = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "python_reference.py"), "--check"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr


def test_export_to_a_place_no_upload_can_go_is_refused_before_writing(tmp_path: Path) -> None:
    """export(to=...) checks the URL prefix first, as `export --to` does: a local path is no
    place to upload to, and nothing is written."""
    job = batchrun.run(chat_requests(2), job_dir=tmp_path / "job", **ECHO)
    printed = cli("export", "--job-dir", str(job.job_dir), "--to", str(tmp_path / "out"))
    assert printed.returncode == 2
    with pytest.raises(batchrun.BatchrunError) as raised:
        job.export(to=str(tmp_path / "out"))
    assert f"error: {raised.value}" in " ".join(printed.stderr.split())
    assert not (job.job_dir / "output.jsonl").exists()


def test_api_key_is_in_the_environment_for_the_call_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """api_key= (`--api-key`) reaches the run's workers through the environment, as the CLI's
    does, and leaves with the call: never saved into the job, never left in a notebook."""
    monkeypatch.delenv("BATCHRUN_REMOTE_API_KEY", raising=False)
    seen: list[str | None] = []
    from batchrun.run import jobs

    real = jobs.submit

    def submit(*args: Any, **kwargs: Any) -> Any:
        seen.append(os.environ.get("BATCHRUN_REMOTE_API_KEY"))
        return real(*args, **kwargs)

    monkeypatch.setattr(jobs, "submit", submit)
    job = batchrun.run(chat_requests(1), job_dir=tmp_path / "job", api_key="sk-test", **ECHO)
    assert seen == ["sk-test"] and "BATCHRUN_REMOTE_API_KEY" not in os.environ
    assert "sk-test" not in (job.job_dir / "manifest.json").read_text(encoding="utf-8")
    with pytest.raises(batchrun.BatchrunError) as raised:
        job.resume(api_key=" ", progress=False)
    assert str(raised.value) == "Invalid value for '--api-key': must not be empty"
