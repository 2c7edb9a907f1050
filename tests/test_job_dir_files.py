"""A user's file where a job keeps its own: never deleted, never written over.

An input named like one of the job's files inside its job directory (journal.jsonl,
errors.jsonl, a worker's log) is refused before anything is made; so is a job directory whose
journal.jsonl is not batchrun's; and export refuses to write its output over the job's input.
Each refusal is one line, exit 1, and the user's file is left byte for byte as it was.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.cli import cli, error_line
from support.jobs import submit_echo
from support.lines import chat_input


@pytest.mark.parametrize("name", ["journal.jsonl", "errors.jsonl", "events.jsonl", "logs/w.jsonl"])
def test_an_input_where_the_job_keeps_a_file_of_its_own_is_refused(
    tmp_path: Path, name: str
) -> None:
    """(journal.jsonl was deleted as an unfinished validation's, errors.jsonl written over by
    the export the submit advised, events.jsonl appended to.)"""
    job = tmp_path / "job"
    (job / name).parent.mkdir(parents=True)
    src = chat_input(job / name, 5)
    before = src.read_bytes()
    r = submit_echo(src, job)
    assert r.returncode == 1, r.stderr
    assert error_line(r.stderr) == (
        f"error: the input file {src} lies where the job keeps its own {name}, which the job "
        "would write over; move the input out of the job directory, or give it another name"
    )
    assert src.read_bytes() == before
    assert not (job / "manifest.json").exists()


def test_a_journal_that_is_not_batchruns_is_kept_and_the_submit_refused(tmp_path: Path) -> None:
    """A journal.jsonl with no batchrun record in it (read leniently, it looked like an empty
    one an interrupted validation leaves, and was deleted)."""
    job = tmp_path / "job"
    job.mkdir()
    foreign = job / "journal.jsonl"
    foreign.write_text('{"note": "my own journal"}\n', encoding="utf-8")
    r = submit_echo(chat_input(tmp_path / "in.jsonl", 5), job)
    assert r.returncode == 1, r.stderr
    assert error_line(r.stderr) == (
        f"error: {foreign} is not a journal of batchrun's (a line of it is no batchrun "
        "record), and the job would keep its own there; move that file, or choose another "
        "--job-dir"
    )
    assert foreign.read_text(encoding="utf-8") == '{"note": "my own journal"}\n'


def test_resume_refuses_a_new_input_where_the_job_keeps_its_output(tmp_path: Path) -> None:
    job = tmp_path / "job"
    assert submit_echo(chat_input(tmp_path / "in.jsonl", 5), job).returncode == 0
    moved = chat_input(job / "output.jsonl", 5)
    r = cli("resume", "--job-dir", str(job), "--input", str(moved), "--force")
    assert r.returncode == 1, r.stderr
    assert "lies where the job keeps its own output.jsonl" in error_line(r.stderr)


def test_export_refuses_to_write_over_the_jobs_input(tmp_path: Path) -> None:
    """The input lies in the output directory under export's name: refused, kept whole; the
    Parquet export there (another name) is written."""
    data = tmp_path / "data"
    data.mkdir()
    src = chat_input(data / "output.jsonl", 5)
    before = src.read_bytes()
    job = tmp_path / "job"
    assert submit_echo(src, job).returncode == 0
    r = cli("export", "--job-dir", str(job), "--output-dir", str(data))
    assert r.returncode == 1, r.stderr
    assert error_line(r.stderr) == (
        f"error: exporting would write over the job's input file {src.resolve()}; choose "
        "another directory with --output-dir"
    )
    assert src.read_bytes() == before and not (data / "errors.jsonl").exists()
    r = cli("export", "--job-dir", str(job), "--output-dir", str(data), "--parquet")
    assert r.returncode == 0, r.stderr
    assert (data / "results.parquet").exists() and src.read_bytes() == before
