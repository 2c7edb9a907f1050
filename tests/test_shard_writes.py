"""Workers write their results' bodies themselves (job/shards.py, workers/outbox.py), as a user's
job runs them: the journal names where each body is and holds none; duplicates and the answer
cache get theirs read back; a worker that died leaves a shard that the next one never appends to;
a shard that cannot be written stops the job with one line, and resume finishes it."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from support.cli import cli
from support.jobs import exported, journal_records, rerun, submit_echo
from support.lines import chat_line, write_jsonl
from support.vectors import (
    each_answered_once_bit_for_bit,
    embeddings_job_killed_mid_run,
    resume_recording,
)

from batchrun.job.shards import (
    SHARD_DIR_ENV,
    SHARD_PROBE_ENV,
    ShardReader,
    leave_probe,
    restore,
    seen_shards,
    shard_ref,
    shards_dir,
)
from batchrun.job.vectors import VectorReader


def _raw_records(job: Path) -> list[dict[str, object]]:
    """The journal's records as they are on the disk (no body read back)."""
    return [json.loads(x) for x in (job / "journal.jsonl").read_bytes().splitlines()]


def test_each_worker_writes_its_bodies_and_the_journal_names_where(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", [chat_line(f"r{i}", f"hello {i}") for i in range(60)])
    job = tmp_path / "job"
    run = submit_echo(src, job, "--workers", "2", "--batch-size", "8")
    assert run.returncode == 0, run.stderr
    raw = (job / "journal.jsonl").read_bytes().splitlines(keepends=True)
    assert len(raw) == 60
    names = set()
    for line in raw:
        rec = json.loads(line)
        assert rec["body"] is None and list(rec)[-1] == "shard"  # the body is the worker's
        ref = shard_ref(line)
        assert ref is not None and ref.name.startswith(f"w{rec['worker']}-")
        names.add(ref.name)
    # One shard a worker process, each named for its worker; nothing else in the directory.
    files = sorted(p.name for p in shards_dir(job).iterdir())
    assert files == sorted(f"{n}.res" for n in names)
    assert {n.split("-")[0] for n in names} <= {"w0", "w1"}
    # Read back, each record holds its own answer, and export writes it.
    answers = {r["custom_id"]: r["body"]["choices"][0]["message"]["content"] for r in journal_records(job)}  # fmt: skip
    out = {o["custom_id"]: o["response"]["body"]["choices"][0]["message"]["content"] for o in exported(job)}  # fmt: skip
    assert out == answers and len(out) == 60
    assert all(f"hello {i}" in out[f"r{i}"] for i in range(60))


def test_duplicates_and_the_answer_cache_take_their_bodies_from_the_shards(
    tmp_path: Path,
) -> None:
    # Greedy (temperature 0): identical lines run once, their duplicates answered with copies.
    lines = [chat_line(f"r{i}", f"same {i % 5}", temperature=0) for i in range(20)]
    src = write_jsonl(tmp_path / "in.jsonl", lines)
    cache = tmp_path / "cache"
    first, second = tmp_path / "first", tmp_path / "second"
    run = submit_echo(src, first, "--cache-dir", str(cache))
    assert run.returncode == 0, run.stderr
    raw = _raw_records(first)
    copies = [r for r in raw if "copy_of" in r]
    assert len(copies) == 15 and len(raw) == 20
    # A copy holds its body itself (its ids are its own), read from its representative's shard.
    assert all(r["body"] is not None and "shard" not in r for r in copies)
    assert all(r["body"] is None and "shard" in r for r in raw if "copy_of" not in r)
    entries = list(cache.rglob("*.json"))
    assert len(entries) == 5  # the answers the workers wrote, read back and kept
    assert all(json.loads(e.read_bytes())["body"]["choices"] for e in entries)
    run = submit_echo(src, second, "--cache-dir", str(cache))
    assert run.returncode == 0, run.stderr
    assert all(r.get("cached") or "copy_of" in r for r in _raw_records(second))
    assert not shards_dir(second).exists() or not any(
        p.stat().st_size for p in shards_dir(second).iterdir()
    )  # nothing ran, nothing written

    def content(job: Path) -> dict[str, str]:
        return {
            o["custom_id"]: o["response"]["body"]["choices"][0]["message"]["content"]
            for o in exported(job)
        }

    answers = content(first)
    assert answers == content(second) and len(answers) == 20
    assert all(f"same {i % 5}" in answers[f"r{i}"] for i in range(20))
    ids = {o["response"]["body"]["id"] for o in exported(first)}
    assert len(ids) == 20  # each copy has its own response id


def test_a_worker_that_died_leaves_its_shard_and_the_next_one_writes_its_own(
    tmp_path: Path,
) -> None:
    lines = [chat_line(f"r{i}", f"hello {i}") for i in range(40)]
    src = write_jsonl(tmp_path / "in.jsonl", lines)
    job = tmp_path / "job"
    env = {"BATCHRUN_ECHO_CRASH_ON": "r25", "BATCHRUN_ECHO_DELAY_MS": "5"}
    run = submit_echo(src, job, "--batch-size", "4", env=env)
    assert run.returncode == 1, run.stderr  # the poison line failed; every other one is done
    shards = list(shards_dir(job).glob("w0-*.res"))
    assert len(shards) >= 2, shards  # the first worker's, and its successors'
    records = journal_records(job)
    ok = [r["custom_id"] for r in records if r["ok"]]
    assert sorted(ok) == sorted(f"r{i}" for i in range(40) if i != 25)
    assert len(set(ok)) == len(ok)  # each once
    out = exported(job)
    assert {o["custom_id"] for o in out} == set(ok)
    assert all(f"hello {o['custom_id'][1:]}" in o["response"]["body"]["choices"][0]["message"]["content"] for o in out)  # fmt: skip


def test_a_shard_that_cannot_be_written_stops_the_job_in_one_line(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", [chat_line(f"r{i}", f"hello {i}") for i in range(20)])
    job = tmp_path / "job"
    job.mkdir()
    (job / "shards").write_text("in the way\n")  # where the workers' directory would go
    run = submit_echo(src, job, "--batch-size", "4")
    assert run.returncode == 1
    errors = [x for x in run.stderr.splitlines() if x.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in run.stderr, run.stderr
    assert re.search(r"cannot write the result shard in .*shards: File exists", errors[0])
    assert "batchrun resume --job-dir" in errors[0]
    (job / "shards").unlink()
    run = rerun("resume", job)
    assert run.returncode == 0, run.stderr
    assert sorted(o["custom_id"] for o in exported(job)) == sorted(f"r{i}" for i in range(20))
    status = cli("status", "--job-dir", str(job), "--json")
    assert json.loads(status.stdout)["requests"]["succeeded"] == 20


def test_a_worker_writes_a_shard_only_where_it_reads_the_parents_token_back(
    tmp_path: Path,
) -> None:
    # A Ray actor's node may not see the job directory, or see another one at the same path.
    directory = tmp_path / "job" / "shards"
    (tmp_path / "job").mkdir()
    token = leave_probe(directory)
    assert token is not None
    env = {SHARD_DIR_ENV: str(directory)}
    assert seen_shards(env) == directory  # a local worker process: no token asked
    assert seen_shards({**env, SHARD_PROBE_ENV: token}) == directory
    assert seen_shards({**env, SHARD_PROBE_ENV: "another job's"}) is None
    gone = {SHARD_DIR_ENV: str(tmp_path / "elsewhere"), SHARD_PROBE_ENV: token}
    assert seen_shards(gone) is None  # a node without the directory
    assert seen_shards({}) is None  # serve's workers: results travel whole
    assert leave_probe(tmp_path / "no" / "such" / "place") is None  # cannot write: travel whole


def test_a_journal_of_an_earlier_version_resumes_into_shards_and_exports_whole(
    tmp_path: Path,
) -> None:
    n = 600
    job, done = embeddings_job_killed_mid_run(tmp_path, n)
    # The journal as a version before shards left it: every body (and vector) in its line.
    journal = job / "journal.jsonl"
    with VectorReader(journal) as vectors, ShardReader(shards_dir(job)) as shards:
        lines = [restore(x, vectors, shards) for x in journal.read_bytes().splitlines(True)]
    assert lines and not any(b'"shard":[' in x or b'"vectors":[' in x for x in lines)
    journal.write_bytes(b"".join(lines))
    shutil.rmtree(shards_dir(job))
    (job / "journal.f32").unlink(missing_ok=True)
    ran = resume_recording(tmp_path, job, b"".join(lines))
    assert not set(ran) & done  # nothing the old journal holds ran again
    raw = journal.read_bytes()
    assert raw.count(b'"shard":[') >= n - len(done) - raw.count(b'"copy_of"')  # the new, in shards
    each_answered_once_bit_for_bit(job, n)
