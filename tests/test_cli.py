"""The command line through Typer's CliRunner: user mistakes get one clear line and an exit code."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.jobs import ECHO, submit_echo
from support.lines import chat_line, write_jsonl
from typer.testing import CliRunner

from batchrun.cli import app

runner = CliRunner()


def run(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.output


def test_help_is_instant_and_never_imports_vllm() -> None:
    code = (
        "import sys, batchrun.cli; assert 'vllm' not in sys.modules and 'torch' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    proc = subprocess.run(
        [sys.executable, "-m", "batchrun", "--help"], capture_output=True, text=True
    )
    assert proc.returncode == 0
    for command in ("submit", "resume", "retry-failed", "export", "status"):
        assert command in proc.stdout


def test_missing_input_file(tmp_path: Path) -> None:
    code, output = run(
        "submit", str(tmp_path / "nope.jsonl"), "--job-dir", str(tmp_path / "j"), "--engine", "echo"
    )
    assert code == 1
    assert "error:" in output and "nope.jsonl" in output and "Traceback" not in output
    assert not (tmp_path / "j").exists()


def test_empty_input_file(tmp_path: Path) -> None:
    src = tmp_path / "empty.jsonl"
    src.write_text("\n  \n")
    code, output = run("submit", str(src), "--job-dir", str(tmp_path / "j"), "--engine", "echo")
    assert code == 1
    assert "empty" in output


def test_a_file_that_is_not_jsonl_at_all(tmp_path: Path) -> None:
    src = tmp_path / "data.csv"
    src.write_text("name,age\nalice,3\nbob,4\n")
    code, output = run(
        "submit", str(src), "--job-dir", str(tmp_path / "j"), "--engine", "echo", "--no-progress"
    )
    assert code == 1
    assert "is not a JSONL file of requests" in output
    assert not (tmp_path / "j").exists()  # nothing half-made is left behind


@pytest.mark.parametrize(
    "text",
    [
        json.dumps([chat_line("a", "hi"), chat_line("b", "ho")]) + "\n",  # one line
        json.dumps([chat_line("a", "hi"), chat_line("b", "ho")], indent=2),  # pretty-printed
    ],
    ids=["one-line", "pretty-printed"],
)
def test_a_file_holding_one_json_array_is_refused_as_not_jsonl(tmp_path: Path, text: str) -> None:
    """An array of request objects is not JSONL: one line naming the conversion, no job (read
    as JSONL it was a job of one invalid line, or of the pretty-printed array's last element)."""
    src = tmp_path / "requests.json"
    src.write_text("\ufeff" + text, encoding="utf-8")
    r = submit_echo(src, tmp_path / "j", progress=True)
    assert (r.returncode, r.stdout, r.stderr) == (
        1,
        "",
        f"error: input file {src} holds a JSON array, not JSONL (one request object a line); "
        f"convert it first (jq -c '.[]' {src} > requests.jsonl)\n",
    )
    assert not (tmp_path / "j").exists()


def test_a_jsonl_file_whose_first_line_is_an_array_is_still_a_job(tmp_path: Path) -> None:
    """Only a whole-file array is refused: a bad first line of a JSONL file is one invalid line."""
    src = write_jsonl(tmp_path / "in.jsonl", [[1, 2], chat_line("a", "hi")])
    r = submit_echo(src, tmp_path / "j", progress=True)
    assert r.returncode == 1 and "1 invalid line" in r.stdout, r.stdout + r.stderr
    assert (tmp_path / "j" / "manifest.json").exists()


# Bad engine options: tests/test_options.py (through a subprocess, every option).


def test_model_that_is_not_a_directory(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", [chat_line("a", "hi")])
    code, output = run(
        "submit", str(src), "--job-dir", str(tmp_path / "j"), "--model", str(tmp_path / "none")
    )
    assert code == 1
    assert "not a directory" in output


def test_commands_on_a_directory_that_is_not_a_job(tmp_path: Path) -> None:
    for command in ("resume", "retry-failed", "status", "export"):
        code, output = run(command, "--job-dir", str(tmp_path))
        assert code == 1, command
        assert f"no job at {tmp_path}" in output


def test_submit_refuses_to_overwrite_a_job(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", [chat_line("a", "hi")])
    job = tmp_path / "j"
    assert (
        run("submit", str(src), "--job-dir", str(job), "--engine", "echo", "--no-progress")[0] == 0
    )
    code, output = run(
        "submit", str(src), "--job-dir", str(job), "--engine", "echo", "--no-progress"
    )
    assert code == 1
    assert "a job already exists" in output and "batchrun resume" in output


def test_status_json_and_table(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", [chat_line("a", "hi there"), chat_line("b", "yo")])
    job = tmp_path / "j"
    assert (
        run("submit", str(src), "--job-dir", str(job), "--engine", "echo", "--no-progress")[0] == 0
    )
    code, output = run("status", "--job-dir", str(job), "--json")
    assert code == 0
    s = json.loads(output)
    assert s["status"] == "completed"
    assert s["requests"] == {
        "total": 2,
        "valid": 2,
        "succeeded": 2,
        "failed": 0,
        "invalid": 0,
        "pending": 0,
    }
    code, output = run("status", "--job-dir", str(job))
    assert code == 0 and "succeeded" in output and "completed" in output


def _restamp(job: Path, *times: float) -> None:
    """Give the journal's results these arrival times, in order."""
    lines = [json.loads(x) for x in (job / "journal.jsonl").read_text().splitlines()]
    stamps = iter(times)
    for rec in lines:
        if rec.get("kind") == "result":
            rec["time"] = next(stamps)
    (job / "journal.jsonl").write_text("".join(json.dumps(rec) + "\n" for rec in lines))


def test_status_throughput_is_over_the_runs_wall_time(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", [chat_line("a", "one two"), chat_line("b", "yo")])
    job = tmp_path / "j"
    assert run("submit", str(src), "--job-dir", str(job), *ECHO)[0] == 0
    # When the results came does not matter: the time is the runs' own.
    _restamp(job, 1000.0, 1004.0)
    status = json.loads(run("status", "--job-dir", str(job), "--json")[1])
    wall = status["wall_s"]
    assert wall > 0 and status["throughput"] == {
        "requests_per_s": round(2 / wall, 2),
        "completion_tokens_per_s": round(3 / wall, 2),
        "over": "runs",
        "seconds": wall,
        "counts": "engine",
    }
    assert "(the engine's, over the runs' wall time)" in (run("status", "--job-dir", str(job))[1])


def test_environment_variables_are_flag_twins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", [chat_line("a", "hi")])
    monkeypatch.setenv("BATCHRUN_ENGINE", "echo")
    monkeypatch.setenv("BATCHRUN_JOB_DIR", str(tmp_path / "envjob"))
    monkeypatch.setenv("BATCHRUN_BATCH_SIZE", "7")
    code, _ = run("submit", str(src), "--no-progress")
    assert code == 0
    manifest = json.loads((tmp_path / "envjob" / "manifest.json").read_text())
    assert manifest["engine"]["engine"] == "echo" and manifest["batch_size"] == 7
