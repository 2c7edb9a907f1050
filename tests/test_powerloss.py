"""Power cuts across the product: submit, resume, retry-failed, export, the answer cache and
serve, each cut at seeded moments on a file system that keeps only what a disk keeps
(tests/support/powerloss/). After every cut the job resumes, every request is answered exactly once,
and nothing a command acknowledged is lost."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import pytest
from support.cli import cli
from support.powerloss.crashes import (
    BATCHRUN,
    CrashPoint,
    Spec,
    Violation,
    answered,
    check_all_answered,
    check_export,
    is_finished,
    make_input,
    recover,
    template_of,
)
from support.powerloss.mount import Cut, require_fuse

pytestmark = [pytest.mark.slow, pytest.mark.powerloss]

# A new seed each run (the moments differ, so runs add up); said in the run's end summary and
# in every failure: BATCHRUN_POWERLOSS_SEED=N repeats a run's choices.
SEED = int(os.environ.get("BATCHRUN_POWERLOSS_SEED") or random.randrange(1_000_000))
REQUESTS = 240
# A small batch and a little latency: results reach the journal in a dozen writes, not two,
# so that cuts land between them.
SLOW_ECHO = {"BATCHRUN_ECHO_DELAY_MS": "3"}
ECHO = ["--engine", "echo", "--batch-size", "24"]


@pytest.fixture(autouse=True)
def fuse_here() -> None:
    """FUSE must work on this machine: the tests fail saying why, never skip."""
    require_fuse()


@pytest.fixture
def spec(tmp_path: Path) -> Spec:
    """The input every crash point runs (outside the mount: only the job's files are on it)."""
    return make_input(tmp_path / "input.jsonl", REQUESTS)


def job_check(spec: Spec, *, command: str = "resume") -> object:
    """The check after a cut of a command that runs the job: finished means every result is on
    the disk; the journal is never corrupt; the job then recovers with `command`."""

    def check(cut: Cut, disk: Path, where: str) -> None:
        job = disk / "job"
        if is_finished(cut, spec):
            check_all_answered(job, spec, f"{where} (it had exited {cut.exit_code})")
        elif job.exists():
            answered(job, spec, where)
        recover(job, spec, where, cli, command=command)

    return check


def submit_point(tmp_path: Path, spec: Spec, cuts: int, **extra: object) -> CrashPoint:
    """`submit` of `spec` into mnt/job, cut `cuts` times."""
    return CrashPoint(
        "submit",
        tmp_path / "submit",
        lambda mnt: [*BATCHRUN, "submit", str(spec.input), "--job-dir", str(mnt / "job"), *ECHO],
        job_check(spec),  # type: ignore[arg-type]
        cuts=cuts,
        seed=SEED,
        env={**os.environ, **SLOW_ECHO},
        **extra,  # type: ignore[arg-type]
    )


def finished_job(tmp_path: Path, spec: Spec, **env: str) -> Path:
    """A job run to its end on a plain disk (tmp_path/NAME/job), as the start of a crash point."""
    base = tmp_path / f"template-{len(env)}"
    done = cli(
        "submit",
        str(spec.input),
        "--job-dir",
        str(base / "job"),
        *ECHO,
        "--max-attempts",
        "1",
        env=env,
    )
    assert done.returncode == 1, done.stderr
    return base


def test_submit_and_resume_survive_power_cuts(
    tmp_path: Path, spec: Spec, record_property: Any
) -> None:
    submit = submit_point(tmp_path, spec, cuts=4)
    total = submit.run()
    # resume from a job cut mid-run: between the manifest's first save and the last result.
    first = next(i for i, op in enumerate(submit.trace) if op.endswith("/job/manifest.json"))
    writes = [i for i, op in enumerate(submit.trace[first:], first) if "write /job/journal" in op]
    # Cut just after a write of results mid-run. The run is shorter than the journal's fsync
    # interval, so what it wrote is unsynced: the tear keeps some of it (a disk's pages written
    # out before the cut), a partial journal with a torn last line.
    at = writes[len(writes) // 2] + 2
    middle = template_of(submit.state_at(at, tear=SEED), tmp_path / "middle")
    ok, _ = answered(middle / "job", spec, "the start of resume")
    print(f"[powerloss] resume starts from a job cut with {sum(ok.values())} of {REQUESTS} results")
    resume = CrashPoint(
        "resume",
        tmp_path / "resume",
        lambda mnt: [*BATCHRUN, "resume", "--job-dir", str(mnt / "job")],
        job_check(spec),  # type: ignore[arg-type]
        template=middle,
        cuts=3,
        seed=SEED + 1,
        env={**os.environ, **SLOW_ECHO},
    )
    total += resume.run()
    said = f"2 crash points (submit, resume), {total} cuts, seeds {SEED} and {SEED + 1}"
    print(f"[powerloss] {said}")
    record_property("powerloss", said)


def test_retry_failed_survives_power_cuts(tmp_path: Path, spec: Spec, record_property: Any) -> None:
    failing = ",".join(list(spec.answers)[::20])
    start = finished_job(tmp_path, spec, BATCHRUN_ECHO_FAIL=failing)
    point = CrashPoint(
        "retry-failed",
        tmp_path / "retry",
        lambda mnt: [*BATCHRUN, "retry-failed", "--job-dir", str(mnt / "job")],
        job_check(spec, command="retry-failed"),  # type: ignore[arg-type]
        template=start,
        cuts=2,
        seed=SEED + 2,
    )
    said = f"1 crash point (retry-failed), {point.run()} cuts, seed {point.seed}"
    print(f"[powerloss] {said}")
    record_property("powerloss", said)


def export_point(
    tmp_path: Path, spec: Spec, parquet: bool, cuts: int, ignore_fsync: str | None = None
) -> CrashPoint:
    """`export` (or `export --parquet`) of a finished job, cut `cuts` times."""
    start = finished_job(tmp_path, spec)
    flag = ["--parquet"] if parquet else []
    names = ["results.parquet"] if parquet else ["output.jsonl", "errors.jsonl"]

    def check(cut: Cut, disk: Path, where: str) -> None:
        job = disk / "job"
        if cut.exit_code == 0:
            check_export(job, spec, f"{where} (export had exited 0)", parquet=parquet)
        elif any((job / name).exists() for name in names):
            # A file an export left must be whole: an atomic rename, its data synced first.
            present = [name for name in names if (job / name).exists()]
            if len(present) == len(names):
                check_export(job, spec, f"{where} (left {present})", parquet=parquet)
            else:
                check_one_whole(job / present[0], spec, where)
        check_all_answered(job, spec, where)
        again = cli("export", "--job-dir", str(job), *flag)
        assert again.returncode == 0, again.stderr
        check_export(job, spec, f"{where}, exported again", parquet=parquet)

    return CrashPoint(
        f"export {'parquet' if parquet else 'jsonl'}",
        tmp_path / "export",
        lambda mnt: [*BATCHRUN, "export", "--job-dir", str(mnt / "job"), *flag],
        check,
        template=start,
        cuts=cuts,
        seed=SEED + 3,
        ignore_fsync=ignore_fsync,
    )


@pytest.mark.parametrize("parquet", [False, True], ids=["jsonl", "parquet"])
def test_export_survives_power_cuts(
    tmp_path: Path, spec: Spec, parquet: bool, record_property: Any
) -> None:
    point = export_point(tmp_path, spec, parquet, cuts=2)
    said = f"1 crash point ({point.name}), {point.run()} cuts, seed {point.seed}"
    print(f"[powerloss] {said}")
    record_property("powerloss", said)


def check_one_whole(path: Path, spec: Spec, where: str) -> None:
    """output.jsonl (or errors.jsonl) alone, left by an export cut between the two: whole."""
    lines = path.read_text().splitlines()
    due = len(spec.answers) if path.name == "output.jsonl" else len(spec.invalid)
    if len(lines) != due or not all(line.endswith("}") for line in lines):
        raise Violation(f"{where}: {path.name} has {len(lines)} lines of {due}: a partial file")


def test_the_answer_cache_survives_power_cuts(
    tmp_path: Path, spec: Spec, record_property: Any
) -> None:
    def check(cut: Cut, disk: Path, where: str) -> None:
        job, cache = disk / "job", disk / "cache"
        if is_finished(cut, spec):
            check_all_answered(job, spec, f"{where} (it had exited {cut.exit_code})")
        elif job.exists():
            answered(job, spec, where)
        # Whatever the cut left of the cache, a job that reads it answers every request once,
        # rightly: an entry lost costs a run, a torn one is a miss.
        if (job / "manifest.json").exists():
            done = cli("resume", "--job-dir", str(job), "--cache-dir", str(cache))
            assert done.returncode == spec.finished_code, done.stdout + done.stderr
            check_all_answered(job, spec, f"{where}, resumed")
        second = disk / "second"
        done = cli(
            "submit", str(spec.input), "--job-dir", str(second), *ECHO, "--cache-dir", str(cache)
        )
        assert done.returncode == spec.finished_code, done.stdout + done.stderr
        check_all_answered(second, spec, f"{where}, a second job on the cache")

    point = CrashPoint(
        "answer cache",
        tmp_path / "cache",
        lambda mnt: [
            *BATCHRUN,
            "submit",
            str(spec.input),
            "--job-dir",
            str(mnt / "job"),
            *ECHO,
            "--cache-dir",
            str(mnt / "cache"),
        ],
        check,
        cuts=2,
        seed=SEED + 4,
        env={**os.environ, **SLOW_ECHO},
    )
    said = f"1 crash point (submit --cache-dir), {point.run()} cuts, seed {point.seed}"
    print(f"[powerloss] {said}")
    record_property("powerloss", said)


def test_serve_survives_power_cuts(tmp_path: Path, record_property: Any) -> None:
    from support.powerloss.served import ServeRun, check_served
    from support.serving import requests_file

    n = 40
    run = ServeRun(requests_file(tmp_path / "requests.jsonl", n), n)

    def check(cut: Cut, disk: Path, where: str) -> None:
        acks = run.acks
        acks.stop.set()
        print(
            f"[powerloss]     acknowledged: {len(acks.files)} uploads, {len(acks.batches)} "
            f"batches, {len(acks.completed)} completed, {len(acks.cancelled)} cancelled"
        )
        check_served(disk / "root", acks, n, where)

    point = CrashPoint(
        "serve",
        tmp_path / "serve",
        run.argv,
        check,
        cuts=2,
        seed=SEED + 5,
        env={**os.environ, **SLOW_ECHO},
        until=run.until,
    )
    said = f"1 crash point (serve: upload, create, run, output, cancel), {point.run()} cuts, seed {point.seed}"
    print(f"[powerloss] {said}")
    record_property("powerloss", said)


@pytest.mark.parametrize("planted", ["^/$", "journal.jsonl$"], ids=["job-dir-name", "journal"])
def test_the_harness_reports_a_missing_fsync(
    tmp_path: Path, spec: Spec, planted: str, record_property: Any
) -> None:
    """With the fsyncs of the mount's root (the job directory's name) or of the journal planted
    away, a power cut just after a finished submit must be reported as a loss."""
    point = submit_point(tmp_path, spec, cuts=0, ignore_fsync=planted)
    with pytest.raises(Violation) as found:
        point.run()
    print(f"[powerloss] planted (fsyncs of {planted} dropped): reported {found.value}")
    assert "gone" in str(found.value) or "no result" in str(found.value)
    record_property("powerloss", f"planted bug (fsyncs of {planted} dropped) reported")


@pytest.mark.parametrize("planted", [r"\.res$", "/shards$"], ids=["shard", "shard-name"])
def test_the_harness_reports_a_shard_whose_fsync_is_missing(
    tmp_path: Path, spec: Spec, planted: str, record_property: Any
) -> None:
    """With the fsyncs of the workers' shards (job/shards.py), or of the directory that holds
    their names, planted away, a power cut just after a finished submit leaves records naming
    bodies the disk does not have: reported, since the worker's fsync is what keeps them."""
    point = submit_point(tmp_path, spec, cuts=0, ignore_fsync=planted)
    with pytest.raises(Violation) as found:
        point.run()
    print(f"[powerloss] planted (fsyncs of {planted} dropped): reported {found.value}")
    assert "lacks" in str(found.value), found.value
    record_property("powerloss", f"planted bug (fsyncs of {planted} dropped) reported")


def test_the_harness_reports_an_export_whose_bytes_were_not_synced(
    tmp_path: Path, spec: Spec, record_property: Any
) -> None:
    """With the fsync of output.jsonl's temporary file planted away, a cut just after an export
    that exited 0 leaves the name without its bytes: reported, not taken for whole."""
    point = export_point(tmp_path, spec, False, cuts=0, ignore_fsync=r"/\.output\.jsonl\.")
    with pytest.raises(Violation) as found:
        point.run()
    print(f"[powerloss] planted (output.jsonl's fsync dropped): reported {found.value}")
    assert "output.jsonl has 0 lines" in str(found.value)
    record_property("powerloss", "planted bug (output.jsonl's fsync dropped) reported")
