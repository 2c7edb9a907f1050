"""A job's life beyond one run, through the real CLI: exporting part of a job, an input file that
changed (`resume --force`), a job moved with its input (`resume --input`), and a job directory
that cannot be written.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support.cli import cli
from support.jobs import journal_records, rerun, start_echo, status_json, submit_echo
from support.lines import chat_input, chat_line, read_jsonl, write_jsonl
from support.paths import ROOT
from support.waits import results_at_least, wait_until


def submit(src: Path, job: Path, *extra: str, env: dict[str, str] | None = None) -> None:
    r = submit_echo(src, job, *extra, env=env)
    assert r.returncode == 0, r.stderr


def tune(src: Path, job: Path) -> set[str]:
    """Create a job that ran only its batch-size probes: most requests are left pending."""
    r = cli(
        "tune", str(src), "--job-dir", str(job), "--engine", "echo", "--no-progress",
        "--min-batch-size", "8", "--max-batch-size", "8",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    return {x["custom_id"] for x in journal_records(job) if x["kind"] == "result"}


def parquet_rows(job: Path) -> list[tuple[str | None, int, str]]:
    import pandas as pd

    df = pd.read_parquet(job / "results.parquet")
    ids = [None if pd.isna(cid) else str(cid) for cid in df["custom_id"]]
    return list(zip(ids, df["line"].astype(int), df["status"], strict=True))


# --- export says what it is ------------------------------------------------------------------


def test_export_refuses_a_job_with_pending_requests_unless_partial(tmp_path: Path) -> None:
    ids = [f"r{i}" for i in range(400)]
    src = chat_input(tmp_path / "in.jsonl", ids, max_tokens=8)
    job = tmp_path / "job"
    done = tune(src, job)
    pending = 400 - len(done)
    assert 0 < len(done) < 400
    refusal = (
        f"error: {pending} requests are still pending; continue the job with: "
        f"batchrun resume --job-dir {job}, or pass --partial to export only what is finished"
    )
    for extra in ([], ["--parquet"]):
        r = cli("export", "--job-dir", str(job), *extra)
        assert (r.returncode, r.stderr.strip(), r.stdout) == (1, refusal, "")
    assert not {"output.jsonl", "errors.jsonl", "results.parquet"} & {p.name for p in job.iterdir()}

    r = cli("export", "--job-dir", str(job), "--partial")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        f"{len(done)} succeeded, 0 failed, 0 invalid lines, {pending} pending "
        "(not in the output: partial export)",
        f"wrote {job / 'output.jsonl'}",
        f"wrote {job / 'errors.jsonl'}",
    ]
    assert {o["custom_id"] for o in read_jsonl(job / "output.jsonl")} == done
    r = cli("export", "--job-dir", str(job), "--partial", "--parquet")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].endswith(
        f"{pending} pending (not in the output: partial export)"
    )
    assert {row[0] for row in parquet_rows(job)} == done

    # Once the job is finished, a plain export says nothing of pending requests.
    assert rerun("resume", job).returncode == 0
    r = cli("export", "--job-dir", str(job))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == "400 succeeded, 0 failed, 0 invalid lines"


def test_export_while_the_job_runs_is_read_only_and_says_it_runs(tmp_path: Path) -> None:
    src = chat_input(tmp_path / "in.jsonl", [f"r{i}" for i in range(400)], max_tokens=8)
    job = tmp_path / "job"
    p = start_echo(src, job, "--batch-size", "4", env={"BATCHRUN_ECHO_DELAY_MS": "100"})
    try:
        wait_until(results_at_least(job, 20), "the job writes 20 results", timeout=60)
        lock_before = (job / "lock").read_text()
        r = cli("export", "--job-dir", str(job))
        assert r.returncode == 1 and r.stdout == "", r.stderr
        message = r.stderr.strip()
        count = message.removeprefix("error: ").split(" ", 1)[0]
        assert 0 < int(count) < 400, message
        assert message == (
            f"error: {count} requests are still pending: the job is running (process {p.pid}); "
            "wait for it to finish, or pass --partial to export only what is finished so far"
        )
        r = cli("export", "--job-dir", str(job), "--partial", "--parquet")
        assert r.returncode == 0, r.stderr
        assert "pending (not in the output: partial export)" in r.stdout
        assert p.poll() is None  # the job ran on, undisturbed
        assert (job / "lock").read_text() == lock_before == f"{p.pid}\n"
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()


# --- a submit still validating its input ---------------------------------------------------

# What a submit holds while it validates: the job's lock and its journal, no manifest yet.
_VALIDATING = (
    "import sys, time; from pathlib import Path; from batchrun.job.lock import job_lock; "
    "from batchrun.job.paths import JobPaths\n"
    "paths = JobPaths(Path(sys.argv[1])); paths.root.mkdir()\n"
    "with job_lock(paths):\n"
    "    paths.journal.touch(); print('validating', flush=True); time.sleep(60)"
)


def test_a_job_whose_submit_validates_is_being_submitted_not_broken(tmp_path: Path) -> None:
    """While a live submit validates (no manifest yet), status says so and exits 0; what needs
    the manifest names that process instead of sending the user to run the submit again; once
    the process is gone, the job is the stopped submit it then is."""
    import batchrun

    job = tmp_path / "job"
    holder = subprocess.Popen(
        [sys.executable, "-c", _VALIDATING, str(job)], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "validating"
        r = cli("status", "--job-dir", str(job))
        assert (r.returncode, r.stdout, r.stderr) == (
            0,
            f"{job}: being submitted, validating its input (pid {holder.pid}); status shows its "
            "counts once it starts running\n",
            "",
        )
        shown = {"job_id": None, "job_dir": str(job), "status": "validating", "pid": holder.pid}
        assert status_json(job) == shown
        assert batchrun.Job(job).status() == shown
        for command in ("resume", "retry-failed", "export"):
            r = cli(command, "--job-dir", str(job))
            assert (r.returncode, r.stderr) == (
                1,
                f"error: the job at {job} is being submitted by process {holder.pid}, which is "
                f"still validating its input; `batchrun status --job-dir {job}` shows when it "
                "runs\n",
            ), command
        assert not (job / "output.jsonl").exists()
    finally:
        holder.kill()
        holder.wait()
    # Killed: its pid is still in the lock file, and the job is a submit stopped while validating.
    r = cli("status", "--job-dir", str(job))
    assert r.returncode == 1 and "If a submit was stopped while validating" in r.stderr, r.stderr


# --- resume --force recounts from the file as it is now -------------------------------------


def test_resume_force_after_finished_lines_were_deleted_counts_the_file_as_it_is(
    tmp_path: Path,
) -> None:
    ids = [f"r{i}" for i in range(400)]
    src = chat_input(tmp_path / "in.jsonl", ids, max_tokens=8)
    job = tmp_path / "job"
    submit(src, job, "--batch-size", "64")
    chat_input(src, ids[10:], max_tokens=8)  # the first 10 finished requests leave the file
    r = rerun("resume", job)
    assert r.returncode == 1 and "changed since the job was submitted" in r.stderr
    r = rerun("resume", job, "--force")
    assert r.returncode == 0, r.stdout + r.stderr
    s = status_json(job)
    assert s["requests"] == {
        "total": 390, "valid": 390, "succeeded": 390, "failed": 0, "invalid": 0, "pending": 0
    }  # fmt: skip
    r = rerun("resume", job)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Some requests failed" not in r.stdout
    assert cli("export", "--job-dir", str(job)).returncode == 0
    assert [o["custom_id"] for o in read_jsonl(job / "output.jsonl")] == ids[10:]
    assert cli("export", "--job-dir", str(job), "--parquet").returncode == 0
    # Line numbers are those of the file as it is now.
    assert parquet_rows(job) == [(cid, i + 1, "succeeded") for i, cid in enumerate(ids[10:])]
    # The journal is append-only: what the removed requests received is still there.
    assert {"r0", "r9"} <= {x["custom_id"] for x in journal_records(job)}


def test_resume_force_after_a_line_was_inserted_numbers_lines_as_the_file_is_now(
    tmp_path: Path,
) -> None:
    src = write_jsonl(
        tmp_path / "in.jsonl",
        [chat_line("a", "one"), "{broken", chat_line("b", "two"), chat_line("c", "three")],
    )
    job = tmp_path / "job"
    r = submit_echo(src, job)
    assert r.returncode == 1  # one invalid line
    # A new request at the top, the broken line fixed: every line moves down by one.
    write_jsonl(
        src,
        [
            *[
                chat_line(cid, text)
                for cid, text in [("new", "zero"), ("a", "one"), ("fixed", "x")]
            ],
            *[chat_line("b", "two"), chat_line("c", "three"), "[1, 2]"],
        ],
    )
    record = tmp_path / "received.txt"
    r = rerun("resume", job, "--force", env={"BATCHRUN_ECHO_RECORD": str(record)})
    assert r.returncode == 1, r.stderr  # the new file has an invalid line of its own
    assert sorted(record.read_text().split()) == ["fixed", "new"]  # a, b, c were done
    s = status_json(job)
    assert s["requests"] == {
        "total": 6, "valid": 5, "succeeded": 5, "failed": 0, "invalid": 1, "pending": 0
    }  # fmt: skip
    assert cli("export", "--job-dir", str(job), "--parquet").returncode == 0
    assert parquet_rows(job) == [
        ("new", 1, "succeeded"),
        ("a", 2, "succeeded"),
        ("fixed", 3, "succeeded"),
        ("b", 4, "succeeded"),
        ("c", 5, "succeeded"),
        (None, 6, "invalid"),
    ]
    assert cli("export", "--job-dir", str(job)).returncode == 0
    errors = read_jsonl(job / "errors.jsonl")
    assert [(e["custom_id"], e["error"]["line"]) for e in errors] == [(None, 6)]
    # The last bad line fixed too: every request of the file succeeds, and the exit code says so.
    write_jsonl(
        src,
        [chat_line(cid, text) for cid, text in [("new", "zero"), ("a", "one"), ("fixed", "x")]]
        + [chat_line("b", "two"), chat_line("c", "three")],
    )
    r = rerun("resume", job, "--force")
    assert r.returncode == 0, r.stdout + r.stderr
    r = rerun("resume", job)
    assert r.returncode == 0, r.stdout + r.stderr
    assert status_json(job)["requests"] == {
        "total": 5, "valid": 5, "succeeded": 5, "failed": 0, "invalid": 0, "pending": 0
    }  # fmt: skip
    assert cli("export", "--job-dir", str(job)).returncode == 0
    assert read_jsonl(job / "errors.jsonl") == []
    assert [o["custom_id"] for o in read_jsonl(job / "output.jsonl")] == [
        "new", "a", "fixed", "b", "c"
    ]  # fmt: skip


# --- a moved job -------------------------------------------------------------------------------


def test_a_job_moved_with_its_input_resumes(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    src = chat_input(project / "input.jsonl", [f"r{i}" for i in range(100)], max_tokens=8)
    done = tune(src, project / "jobs" / "x")
    assert len(done) < 100
    moved = tmp_path / "project2"
    project.rename(moved)
    job = moved / "jobs" / "x"
    r = rerun("resume", job)
    assert r.returncode == 0, r.stdout + r.stderr
    manifest = json.loads((job / "manifest.json").read_text())
    assert manifest["input_path"] == str(moved / "input.jsonl")
    assert status_json(job)["input"] == str(moved / "input.jsonl")


def test_resume_input_points_a_job_at_its_moved_input(tmp_path: Path) -> None:
    src = chat_input(tmp_path / "in.jsonl", [f"r{i}" for i in range(100)], max_tokens=8)
    job = tmp_path / "job"
    tune(src, job)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    moved = src.rename(elsewhere / "in.jsonl")
    r = rerun("resume", job)
    assert (r.returncode, r.stderr.strip()) == (
        1,
        f"error: the job's input file {src} is gone; put it back, or point the job at its new "
        f"place with: batchrun resume --job-dir {job} --input PATH "
        "(finished results can still be exported)",
    )
    # Another file (its sha256 differs) is refused without --force.
    other = chat_input(tmp_path / "other.jsonl", [f"r{i}" for i in range(101)], max_tokens=8)
    r = rerun("resume", job, "--input", str(other))
    assert (r.returncode, r.stderr.strip()) == (
        1,
        f"error: {other} is not the job's input file (its sha256 differs from the one "
        "submitted); pass --force to run it as the job's input as it is now "
        "(requests already finished are kept and not run again)",
    )
    r = rerun("resume", job, "--input", str(moved))
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads((job / "manifest.json").read_text())["input_path"] == str(moved)
    # The manifest remembers the new place: a plain resume finds it.
    assert rerun("resume", job).returncode == 0
    r = rerun("resume", job, "--input", str(other), "--force")
    assert r.returncode == 0, r.stdout + r.stderr
    assert status_json(job)["requests"]["succeeded"] == 101


# --- a job directory that cannot be written ----------------------------------------------------


_READ_ONLY = (
    'for p in "$@"; do [ "$p" = -- ] && break; mount --bind "$p" "$p" && '
    'mount -o remount,bind,ro "$p" || exit 99; done; '
    'while [ "$1" != -- ]; do shift; done; shift; exec "$@"'
)


@functools.cache
def _can_bind_read_only() -> bool:
    """Whether this process may make a path read-only in a private mount namespace (root)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "-m", "sh", "-c", _READ_ONLY, "sh", str(ROOT), "--", "true"],
        capture_output=True,
    )
    return probe.returncode == 0


def cli_read_only(
    read_only: list[Path], *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the CLI with `read_only` paths not writable for real: a read-only bind mount in a
    private mount namespace as root (EROFS), else permissions taken away (EACCES)."""
    command = [sys.executable, "-m", "batchrun", *args]
    full_env = {**os.environ, **(env or {})}
    if os.geteuid() != 0:
        modes = {p: p.stat().st_mode for p in read_only}
        for p in read_only:
            p.chmod(0o555 if p.is_dir() else 0o444)
        try:
            return subprocess.run(command, capture_output=True, text=True, env=full_env, cwd=ROOT)
        finally:
            for p, mode in modes.items():
                p.chmod(mode)
    if not _can_bind_read_only():
        pytest.skip("running as root without a private mount namespace: nothing is read-only")
    wrapped = ["unshare", "-m", "sh", "-c", _READ_ONLY, "sh", *map(str, read_only), "--", *command]
    r = subprocess.run(wrapped, capture_output=True, text=True, env=full_env, cwd=ROOT)
    assert r.returncode != 99, f"could not make {read_only} read-only: {r.stderr}"
    return r


@pytest.mark.slow
def test_commands_on_a_read_only_job_directory_say_so_in_one_line(tmp_path: Path) -> None:
    src = chat_input(tmp_path / "in.jsonl", [f"r{i}" for i in range(50)], max_tokens=8)
    job = tmp_path / "job"
    tune(src, job)
    files = [job, *job.iterdir()] if os.geteuid() != 0 else [job]
    why = "Read-only file system" if os.geteuid() == 0 else "Permission denied"
    lock_error = (
        f"error: cannot write the job's lock file {job / 'lock'}: {why} (running a job needs a "
        "writable job directory; export can write elsewhere with --output-dir)"
    )
    for command in (["resume"], ["retry-failed"]):
        r = cli_read_only(files, *command, "--job-dir", str(job), "--no-progress")
        assert (r.returncode, r.stderr.strip()) == (1, lock_error), r.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    r = cli_read_only(
        [empty], "submit", str(src), "--job-dir", str(empty), "--engine", "echo", "--no-progress"
    )
    assert "Traceback" not in r.stderr
    assert (r.returncode, r.stderr.strip().splitlines()[-1]) == (
        1,
        f"error: cannot write the job's lock file {empty / 'lock'}: {why} (running a job needs "
        "a writable job directory; export can write elsewhere with --output-dir)",
    )
    r = cli_read_only(files, "export", "--job-dir", str(job), "--partial")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "--output-dir" in r.stderr
    # Export only reads the job: elsewhere, it writes its files.
    out = tmp_path / "out"
    r = cli_read_only(files, "export", "--job-dir", str(job), "--partial", "--output-dir", str(out))
    assert r.returncode == 0, r.stderr
    assert (out / "output.jsonl").exists()
    r = cli_read_only(files, "status", "--job-dir", str(job), "--json")
    assert r.returncode == 0, r.stderr


def test_a_journal_that_cannot_be_written_is_one_clear_line(tmp_path: Path) -> None:
    src = chat_input(tmp_path / "in.jsonl", [f"r{i}" for i in range(50)], max_tokens=8)
    job = tmp_path / "job"
    tune(src, job)
    r = cli_read_only([job / "journal.jsonl"], "resume", "--job-dir", str(job), "--no-progress")
    why = "Read-only file system" if os.geteuid() == 0 else "Permission denied"
    assert (r.returncode, r.stderr.strip().splitlines()[-1]) == (
        1,
        f"error: cannot open the journal {job / 'journal.jsonl'}: {why}",
    ), r.stderr
    assert "Traceback" not in r.stderr


def test_a_lock_that_cannot_be_written_is_one_clear_line(tmp_path: Path) -> None:
    """A write that fails at the lock (a full disk, here a file-size limit: the same path)."""
    import resource

    src = chat_input(tmp_path / "in.jsonl", [f"r{i}" for i in range(20)], max_tokens=8)
    job = tmp_path / "job"
    tune(src, job)

    def no_file_growth() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))

    r = subprocess.run(
        [sys.executable, "-m", "batchrun", "resume", "--job-dir", str(job), "--no-progress"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        preexec_fn=no_file_growth,
        timeout=120,
    )
    assert (r.returncode, r.stderr.strip()) == (
        1,
        f"error: cannot write the job's lock file {job / 'lock'}: File too large (running a job "
        "needs a writable job directory; export can write elsewhere with --output-dir)",
    )


def test_lock_errors_map_to_one_clear_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ENOSPC cannot be provoked on demand outside a full file system: the mapping, in-process."""
    import errno

    from batchrun.errors import BatchrunError
    from batchrun.job import lock as job_module
    from batchrun.job.paths import JobPaths

    paths = JobPaths(tmp_path)

    def full(*_: object) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(job_module, "_write_pid", full)
    with pytest.raises(BatchrunError) as e, job_module.job_lock(paths):
        pass
    assert str(e.value) == (
        f"cannot write the job's lock file {paths.lock}: No space left on device (running a "
        "job needs a writable job directory; export can write elsewhere with --output-dir)"
    )
