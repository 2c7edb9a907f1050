"""Engine options through the real CLI: checked before a job exists, replaceable on resume and
retry-failed, and the advice after a run names the command that makes progress."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.cli import cli
from support.jobs import ECHO, journal_records, rerun, submit_echo
from support.lines import chat_input, chat_line, write_jsonl
from support.paths import ROOT

from batchrun.config import SEED_MAX
from batchrun.engines.vllm.reasoning import parser_names

# Wide enough that neither Typer's error box nor the summary table wraps a line.
WIDE = {"COLUMNS": "1000"}
# Stands for the list of vLLM's reasoning parsers in an expected message, filled in by the test
# that meets it: listing them imports vLLM, which collection would otherwise do in every process.
VLLM_PARSERS = "<vLLM's reasoning parsers>"


def box(proc: subprocess.CompletedProcess[str]) -> str:
    """The message in Typer's error box on stderr (a usage error), its lines joined."""
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [ln.strip("│ ") for ln in proc.stderr.splitlines() if ln.startswith("│")]
    return " ".join(lines)


def advice(proc: subprocess.CompletedProcess[str]) -> str:
    """The line printed after the summary table."""
    return proc.stdout.rstrip("\n").splitlines()[-1]


def env_hint(option: str) -> str:
    return f"(env var: 'BATCHRUN_{option.lstrip('-').replace('-', '_').upper()}')"


def out_of_range(option: str, value: int, low: int, high: int | None = None) -> str:
    """Click's message for a number outside an option's range (x>=low, or low<=x<=high)."""
    bounds = f"x>={low}" if high is None else f"{low}<=x<={high}"
    return f"Invalid value for '{option}' {env_hint(option)}: {value} is not in the range {bounds}."


def gpus_error(message: str) -> str:
    return f"Invalid value for '--gpus' {env_hint('--gpus')}: {message}"


BAD_SUBMIT_OPTIONS = [
    (["--workers", "-2"], out_of_range("--workers", -2, 1)),
    (["--workers", "0"], out_of_range("--workers", 0, 1)),
    (
        ["--dtype", "banana"],
        f"Invalid value for '--dtype' {env_hint('--dtype')}: 'banana' is not one of "
        "'auto', 'half', 'float16', 'bfloat16', 'float', 'float32'.",
    ),
    (["--seed", "-1"], out_of_range("--seed", -1, 0, SEED_MAX)),
    (["--seed", "99999999999999999999"], out_of_range("--seed", 99999999999999999999, 0, SEED_MAX)),
    (["--seed", str(2**32)], out_of_range("--seed", 2**32, 0, SEED_MAX)),
    (["--max-model-len", "0"], out_of_range("--max-model-len", 0, 1)),
    (["--max-model-len", "-10"], out_of_range("--max-model-len", -10, 1)),
    (["--batch-size", "0"], out_of_range("--batch-size", 0, 1, 2048)),
    (["--batch-size", "99999999999"], out_of_range("--batch-size", 99999999999, 1, 2048)),
    (["--min-batch-size", "0"], out_of_range("--min-batch-size", 0, 1, 2048)),
    (["--max-batch-size", "4096"], out_of_range("--max-batch-size", 4096, 1, 2048)),
    (
        ["--min-batch-size", "64", "--max-batch-size", "8"],
        "Invalid value for '--min-batch-size' / '--max-batch-size': "
        "the lower bound 64 is above the upper bound 8",
    ),
    (
        ["--gpu-memory-utilization", "0"],
        f"Invalid value for '--gpu-memory-utilization' {env_hint('--gpu-memory-utilization')}: "
        "must be above 0 and at most 1, got 0.0",
    ),
    (
        ["--gpu-memory-utilization", "1.5"],
        f"Invalid value for '--gpu-memory-utilization' {env_hint('--gpu-memory-utilization')}: "
        "must be above 0 and at most 1, got 1.5",
    ),
    (["--tensor-parallel-size", "0"], out_of_range("--tensor-parallel-size", 0, 1)),
    (
        ["--gpus", "a,b"],
        gpus_error("takes GPU indices or UUIDs separated by commas (e.g. 0,1,2,3), got 'a,b'"),
    ),
    (
        ["--gpus", ""],
        gpus_error("names no GPU; give ids like 0,1,2,3, or leave it out for all visible GPUs"),
    ),
    (["--gpus", "0,0"], gpus_error("names GPU 0 more than once")),
    (
        ["--gpus", "0", "--tensor-parallel-size", "2", "--engine", "vllm"],
        "Invalid value for '--tensor-parallel-size' / '--gpus': "
        "2 GPUs per engine need at least 2 GPUs, but --gpus names 1",
    ),
    (["--max-attempts", "0"], out_of_range("--max-attempts", 0, 1, 100)),
    (["--max-attempts", "101"], out_of_range("--max-attempts", 101, 1, 100)),
    (
        ["--reasoning-parser", "qwen", "--engine", "vllm"],
        "Invalid value for '--reasoning-parser': names no "
        "reasoning parser of vllm's, got 'qwen'; it has " + VLLM_PARSERS,
    ),
    (
        ["--engine", "gpt"],
        f"Invalid value for '--engine' {env_hint('--engine')}: 'gpt' is not one of 'vllm', 'echo', 'remote'.",
    ),
]


@pytest.mark.parametrize(
    ("command", "args", "message"),
    [("submit", *case) for case in BAD_SUBMIT_OPTIONS]
    # tune takes no --batch-size at all (tested on its own below).
    + [("tune", *case) for case in BAD_SUBMIT_OPTIONS if "--batch-size" not in case[0]],
)
def test_a_bad_option_is_a_usage_error_and_creates_nothing(
    tmp_path: Path, command: str, args: list[str], message: str
) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", [chat_line("a", "hi")])
    job = tmp_path / "job"
    r = cli(command, str(src), "--job-dir", str(job), *ECHO, *args, env=WIDE)
    assert r.returncode == 2, r.stdout + r.stderr
    if VLLM_PARSERS in message:  # vLLM's parser names, read here: importing vLLM takes seconds
        message = message.replace(VLLM_PARSERS, ", ".join(parser_names()))
    assert box(r) == message
    assert not job.exists()


def test_the_environment_twin_is_checked_the_same_way(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", [chat_line("a", "hi")])
    job = tmp_path / "job"
    r = submit_echo(src, job, env={**WIDE, "BATCHRUN_SEED": "-1"})
    assert r.returncode == 2
    assert box(r) == out_of_range("--seed", -1, 0, SEED_MAX)
    assert not job.exists()


def test_an_empty_job_dir_is_refused_not_the_current_directory(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", [chat_line("a", "hi")])
    r = subprocess.run(
        [sys.executable, "-m", "batchrun", "submit", str(src), "--job-dir", "", *ECHO],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, **WIDE, "PYTHONPATH": str(ROOT)},
        timeout=120,
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert box(r) == (
        "Invalid value for '--job-dir' / '-j' (env var: 'BATCHRUN_JOB_DIR'): "
        "must name a directory, not be empty"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]


def test_a_job_dir_that_is_a_file_is_refused(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", [chat_line("a", "hi")])
    afile = tmp_path / "notes.txt"
    afile.write_text("keep me\n")
    r = submit_echo(src, afile, env=WIDE)
    assert r.returncode == 2
    assert box(r) == f"Invalid value for '--job-dir': {afile} is a file, not a directory"
    assert afile.read_text() == "keep me\n"


def test_tune_is_its_own_command_without_a_batch_size(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", [chat_line(f"r{i}", "hi") for i in range(20)])
    job = tmp_path / "my job"
    r = cli("tune", str(src), "--job-dir", str(job), *ECHO, "--batch-size", "8", env=WIDE)
    assert r.returncode == 2
    assert box(r).startswith("No such option: --batch-size")
    assert not job.exists()

    r = cli("tune", str(src), "--job-dir", str(job), *ECHO, "--max-batch-size", "16", env=WIDE)
    assert r.returncode == 0, r.stdout + r.stderr
    manifest = json.loads((job / "manifest.json").read_text())
    assert manifest["batch_size_source"] == "search" and manifest["probes"]
    assert advice(r) == (
        f"batch size {manifest['batch_size']}; run the rest with: batchrun resume --job-dir '{job}'"
    )


# --- resume and retry-failed replace the job's options ---------------------------------------


def _job_with_pending(tmp_path: Path, name: str = "my job", n: int = 3) -> Path:
    """An echo job whose last request has no result (as after a kill)."""
    src = chat_input(tmp_path / "in.jsonl", n, "hi")
    job = tmp_path / name
    r = submit_echo(src, job, env=WIDE)
    assert r.returncode == 0, r.stdout + r.stderr
    kept = [rec for rec in journal_records(job) if rec.get("custom_id") != f"r{n - 1}"]
    write_jsonl(job / "journal.jsonl", kept)
    return job


def _edit_manifest(job: Path, **engine: object) -> bytes:
    manifest = json.loads((job / "manifest.json").read_text())
    manifest["engine"].update(engine)
    (job / "manifest.json").write_text(json.dumps(manifest))
    return (job / "manifest.json").read_bytes()


def test_resume_replaces_a_saved_option_no_engine_takes(tmp_path: Path) -> None:
    job = _job_with_pending(tmp_path)
    saved = _edit_manifest(job, dtype="banana")  # as an older batchrun let through
    r = rerun("resume", job, env=WIDE)
    assert r.returncode == 1
    assert r.stderr == (
        "error: the job's saved --dtype must be one of auto, half, float16, bfloat16, float, "
        "float32, got 'banana'; pass --dtype to replace it\n"
    )
    r = rerun("resume", job, "--dtype", "banana", env=WIDE)
    assert r.returncode == 2 and "'banana' is not one of" in box(r)
    assert (job / "manifest.json").read_bytes() == saved  # refused: nothing changed

    r = rerun("resume", job, "--dtype", "bfloat16", "--max-attempts", "5", env=WIDE)
    assert r.returncode == 0, r.stdout + r.stderr
    line = "overrides: --dtype bfloat16 (was banana), --max-attempts 5 (was 3)"
    assert r.stderr.splitlines()[0] == line
    assert f"│ overrides  │ {line.removeprefix('overrides: ')} " in r.stdout
    manifest = json.loads((job / "manifest.json").read_text())
    assert manifest["engine"]["dtype"] == "bfloat16" and manifest["max_attempts"] == 5
    assert manifest["overrides"][-1]["options"] == {
        "dtype": {"old": "banana", "new": "bfloat16"},
        "max_attempts": {"old": 3, "new": 5},
    }
    assert manifest["counts"]["succeeded"] == 3


def test_only_options_given_as_flags_override(tmp_path: Path) -> None:
    job = _job_with_pending(tmp_path)
    before = json.loads((job / "manifest.json").read_text())
    # A variable left set in the shell is not an override: it would change the job unseen.
    r = rerun("resume", job, env={**WIDE, "BATCHRUN_SEED": "7"})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "overrides" not in r.stderr + r.stdout
    after = json.loads((job / "manifest.json").read_text())
    assert after["engine"] == before["engine"] and after["overrides"] == []


def test_retry_failed_takes_the_same_options(tmp_path: Path) -> None:
    job = _job_with_pending(tmp_path)
    r = rerun("retry-failed", job, "--seed", "-1", env=WIDE)
    assert r.returncode == 2
    assert box(r) == f"Invalid value for '--seed': -1 is not in the range 0<=x<={SEED_MAX}."
    r = rerun("retry-failed", job, "--min-batch-size", "512", "--max-batch-size", "256", env=WIDE)
    assert r.returncode == 2
    assert box(r) == (
        "Invalid value for '--min-batch-size' / '--max-batch-size': "
        "the lower bound 512 is above the upper bound 256"
    )
    given = ("--workers", "2", "--no-enforce-eager")
    saved = _options_saved(job)
    r = rerun("retry-failed", job, *given, env=WIDE)
    assert r.returncode == 1  # the pending request is still pending: retry-failed runs failures
    # Nothing failed, so nothing ran with the options: the job keeps its own.
    assert r.stderr.splitlines()[0] == "nothing to run: the options given were not saved"
    assert _options_saved(job) == saved

    src = write_jsonl(tmp_path / "in2.jsonl", [chat_line("r0", "hi"), chat_line("r1", "yo")])
    failing = tmp_path / "failing"
    env = {**WIDE, "BATCHRUN_ECHO_FAIL": "r1"}
    r = submit_echo(src, failing, "--max-attempts", "1", env=env)
    assert r.returncode == 1, r.stdout + r.stderr
    r = rerun("retry-failed", failing, *given, env=env)
    assert r.returncode == 1  # r1 still fails
    assert r.stderr.splitlines()[0] == (
        "overrides: --no-enforce-eager (was not set), --workers 2 (was not set)"
    )
    manifest = json.loads((failing / "manifest.json").read_text())
    assert manifest["workers"] == 2 and manifest["engine"]["enforce_eager"] is False


def _options_saved(job: Path) -> dict[str, object]:
    """What a job's manifest says of its options (not of its runs)."""
    manifest = json.loads((job / "manifest.json").read_text())
    keys = ("engine", "model", "max_attempts", "batch_bounds", "gpus", "workers", "order")
    return {k: manifest[k] for k in (*keys, "overrides")}


def test_a_resume_that_runs_nothing_or_is_refused_changes_no_option(tmp_path: Path) -> None:
    job = _job_with_pending(tmp_path, n=2)
    r = rerun("resume", job, env=WIDE)
    assert r.returncode == 0, r.stdout + r.stderr
    saved = _options_saved(job)
    # Finished: a resume with options runs nothing and saves none of them.
    r = rerun("resume", job, "--seed", "3", env=WIDE)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "nothing to run: the options given were not saved" in r.stderr
    assert "overrides" not in r.stdout
    assert _options_saved(job) == saved and saved["overrides"] == []
    # A journal that cannot be read refuses the run before any option is saved.
    with (job / "journal.jsonl").open("ab") as f:
        f.write(b"{broken\n")
        f.write(json.dumps(journal_records(job)[0]).encode() + b"\n")
    saved = (job / "manifest.json").read_bytes()
    r = rerun("resume", job, "--seed", "3", env=WIDE)
    assert r.returncode == 1 and "corrupt" in r.stderr, r.stderr
    assert (job / "manifest.json").read_bytes() == saved


# --- the advice after a run -------------------------------------------------------------------


def test_retry_failed_on_an_interrupted_job_advises_resume(tmp_path: Path) -> None:
    job = _job_with_pending(tmp_path)
    r = rerun("retry-failed", job, env=WIDE)
    assert r.returncode == 1
    assert advice(r) == f"1 request not run yet; continue with: batchrun resume --job-dir '{job}'"


def test_failed_requests_advise_retry_failed(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", [chat_line("r0", "hi"), chat_line("r1", "yo")])
    job = tmp_path / "my job"
    r = submit_echo(src, job, "--max-attempts", "1", env={**WIDE, "BATCHRUN_ECHO_FAIL": "r1"})
    assert r.returncode == 1
    assert advice(r) == (
        f"1 request failed: see it with `batchrun export --job-dir '{job}'` (errors.jsonl), "
        f"or run it again with `batchrun retry-failed --job-dir '{job}'`."
    )


def test_a_file_of_invalid_lines_only_claims_no_success(tmp_path: Path) -> None:
    """No valid line: nothing succeeded, and the advice must not say every request did."""
    src = write_jsonl(tmp_path / "in.jsonl", ["{not json", {"custom_id": "x"}])
    job = tmp_path / "my job"
    r = submit_echo(src, job, env=WIDE)
    assert r.returncode == 1, r.stderr
    assert "succeeded" not in advice(r)
    assert advice(r) == (
        "No line is valid; 2 invalid input lines cannot run as written: "
        f"`batchrun export --job-dir '{job}'` writes the results (errors.jsonl names each invalid "
        f"line by its number); fix them in the input file, then "
        f"`batchrun resume --job-dir '{job}' --force` runs them."
    )


def test_invalid_lines_only_advise_fixing_the_input(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", [chat_line("r0", "hi"), "{not json"])
    job = tmp_path / "my job"
    r = submit_echo(src, job, env=WIDE)
    assert r.returncode == 1
    assert "│ requests   │ 2 (1 valid, 1 invalid line)" in r.stdout
    assert "│ this run   │ 1 attempt in " in r.stdout
    assert advice(r) == (
        "Every valid request succeeded; 1 invalid input line cannot run as written: "
        f"`batchrun export --job-dir '{job}'` writes the results (errors.jsonl names each invalid "
        f"line by its number); fix it in the input file, then "
        f"`batchrun resume --job-dir '{job}' --force` runs it."
    )
    # The advice works: the line fixed in place, the advised command runs it and ends the job.
    write_jsonl(src, [chat_line("r0", "hi"), chat_line("r1", "fixed")])
    again = rerun("resume", job, "--force", env=WIDE)
    assert again.returncode == 0, again.stderr
    assert advice(again) == f"Write the results with: batchrun export --job-dir '{job}'"


def test_a_finished_job_advises_export_and_a_second_submit_resume(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", [chat_line("r0", "hi")])
    job = tmp_path / "my job"
    r = submit_echo(src, job, env=WIDE)
    assert r.returncode == 0
    assert advice(r) == f"Write the results with: batchrun export --job-dir '{job}'"
    r = submit_echo(src, job, env=WIDE)
    assert r.returncode == 1
    assert r.stderr.splitlines()[-1] == (
        f"error: a job already exists in {job}; continue it with "
        f"`batchrun resume --job-dir '{job}'`, or choose another --job-dir"
    )


# --- cosmetics --------------------------------------------------------------------------------


def test_help_keeps_the_bracketed_texts() -> None:
    r = cli("submit", "--help", env={"COLUMNS": "400"})
    assert r.returncode == 0
    assert "pip install 'batchrun[ray]'" in r.stdout
    assert "[default: jobs/<input file name>]" in r.stdout
    assert "[default: the embedded SmolLM2-135M-Instruct]" in r.stdout


def test_status_of_a_file_says_it_is_a_file(tmp_path: Path) -> None:
    afile = tmp_path / "somefile.txt"
    afile.write_text("x\n")
    r = cli("status", "--job-dir", str(afile), env=WIDE)
    assert r.returncode == 1
    assert r.stderr == f"error: no job at {afile}: it is a file, not a job directory\n"


def test_every_engine_option_is_a_given_option() -> None:
    from batchrun.cli.options import ENGINE_OPTIONS
    from batchrun.config import GivenOptions

    # `models` is --model's own: its NAME=PATH values, split off from the plain form's `model`.
    fields = [f.name for f in dataclasses.fields(GivenOptions) if f.name != "models"]
    assert sorted(o.name for o in ENGINE_OPTIONS) == sorted(fields)
