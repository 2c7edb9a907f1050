"""Which server owns a job is the job's own fact (the manifest's `served_by`, job/served.py), not
something the core reads from the server's directory layout: a batch's job keeps its owner
wherever its directory is, and `resume`, `retry-failed`, `submit` and `export` go by it."""

from __future__ import annotations

import json
from pathlib import Path

from support.cli import cli
from support.jobs import rerun, submit_echo
from support.lines import chat_line, write_jsonl

from batchrun.job.manifest import Manifest, load_manifest, save_manifest
from batchrun.job.paths import JobPaths
from batchrun.job.served import ServedBatch, mark_served, served_batch
from batchrun.serve.jobview import claim_job


def echo_job(tmp_path: Path, n: int = 3) -> Path:
    src = write_jsonl(tmp_path / "in.jsonl", [chat_line(f"r{i}", "hi") for i in range(n)])
    job = tmp_path / "job"
    r = submit_echo(src, job)
    assert r.returncode == 0, r.stderr
    return job


def test_claim_marks_the_job_as_the_servers(tmp_path: Path) -> None:
    """serve's claim stamps the batch id and the root (ROOT/batches/<id>) into the manifest."""
    job = echo_job(tmp_path)
    paths = JobPaths(job)
    manifest = load_manifest(paths)
    assert served_batch(manifest) is None
    root = tmp_path / "root"
    batch_dir = root / "batches" / "batch_0123456789abcdef01234567"
    batch_dir.parent.mkdir(parents=True)
    job.rename(batch_dir)
    claim_job(JobPaths(batch_dir), manifest, batch_dir.name)
    again = load_manifest(JobPaths(batch_dir))
    assert served_batch(again) == ServedBatch(batch_dir.name, root.resolve())
    assert again.job_id == batch_dir.name
    raw = json.loads((batch_dir / "manifest.json").read_text())
    assert raw["served_by"] == {"batch_id": batch_dir.name, "root": str(root.resolve())}


def test_a_served_job_is_refused_by_resume_wherever_it_lies(tmp_path: Path) -> None:
    """No batch.json, no batches/ directory: the manifest alone says whose job it is."""
    job = echo_job(tmp_path)
    paths = JobPaths(job)
    manifest: Manifest = load_manifest(paths)
    assert mark_served(manifest, "batch_0123456789abcdef01234567", Path("/srv/root"))
    assert not mark_served(manifest, "batch_0123456789abcdef01234567", Path("/srv/root"))
    save_manifest(paths, manifest)
    for command in ("resume", "retry-failed"):
        r = cli(command, "--job-dir", str(job))
        assert r.returncode == 1
        assert r.stderr == (
            "error: this job is batch batch_0123456789abcdef01234567 of `batchrun serve --root "
            f"/srv/root`; it runs there (the API's batch), not with {command}\n"
        )
    src = write_jsonl(tmp_path / "more.jsonl", [chat_line("x", "hi")])
    r = submit_echo(src, job, progress=True)
    assert r.returncode == 1
    assert r.stderr == (
        f"error: a job already exists in {job}; it runs on `batchrun serve --root /srv/root`, "
        "or choose another --job-dir\n"
    )


def test_a_job_of_the_command_line_in_a_batch_like_place_is_its_own(tmp_path: Path) -> None:
    """A directory named like a batch beside a batch.json is not the server's unless the server
    said so: the command line's job resumes."""
    root = tmp_path / "root" / "batches"
    root.mkdir(parents=True)
    job = echo_job(tmp_path)
    batch_dir = root / "batch_0123456789abcdef01234567"
    job.rename(batch_dir)
    (batch_dir / "batch.json").write_text("{}")
    r = rerun("resume", batch_dir)
    assert r.returncode == 0, r.stderr
