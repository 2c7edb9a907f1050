"""status costs O(1) in the journal's length: the job's summary plus the journal's tail, checked
against the journal, rebuilt when it cannot be trusted (job/summary.py)."""

from __future__ import annotations

import json
import random
import re
import shutil
import subprocess
import sys
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from support.jobs import rerun, start_echo, status_json, submit_echo
from support.lines import chat_input, chat_line, write_jsonl
from support.paths import ROOT
from support.waits import wait_until

import batchrun.job.summary as summary_module
from batchrun.job.inputmap import write_input_map
from batchrun.job.journal import JournalWriter, encode_records
from batchrun.job.manifest import InputMapRef, Manifest, Run, load_manifest, save_manifest
from batchrun.job.paths import JobPaths
from batchrun.job.state import JobState, replay
from batchrun.job.status import job_status
from batchrun.job.summary import (
    SUMMARY_NAME,
    SummaryKeeper,
    current_summary,
    rebuild,
    summary_path,
    write_summary,
)
from batchrun.job.summary_counts import Summary
from batchrun.openai.records import Outcome

RUN_START = 1_700_000_000.0


def manifest(requests: int, **fields: Any) -> Manifest:
    """A manifest with the fields every job has."""
    base: dict[str, Any] = dict(
        job_id="j1", created_at=1.0, input_path="/in.jsonl", input_sha256="0" * 64,
        input_bytes=10, requests=requests, invalid=0, runs=[Run(mode="submit", started_at=RUN_START, pid=1)],
    )  # fmt: skip
    return Manifest(**{**base, **fields})


def writer_records(
    rng: random.Random,
    n: int,
    generation: str | None,
    ids: list[str] | None = None,
    status: dict[str, str] | None = None,
    attempts: dict[str, int] | None = None,
) -> list[dict[str, Any]]:
    """Records as batchrun's writers journal them: attempt 1 for a request with none, a later
    attempt only after a failed one (retry passes, retry-failed); copies of a representative's
    outcome and cache hits for requests with none; invalid lines of this and another input
    generation; several workers. `ids`: the requests that run (all `n` by default); `status`,
    `attempts`: the writer's state, carried from one call to the next."""
    status = {} if status is None else status  # custom_id -> "ok" | "retry" | "final"
    attempts = {} if attempts is None else attempts
    ids = [f"r{i}" for i in range(n)] if ids is None else ids
    t = RUN_START + sum(attempts.values())
    records: list[dict[str, Any]] = []

    def result(cid: str, **extra: Any) -> dict[str, Any]:
        nonlocal t
        t += rng.choice([0.0, 0.001, 0.5])
        attempt = attempts.get(cid, 0) + 1
        attempts[cid] = attempt
        outcome = rng.choice(["ok", "ok", "ok", "retry", "final"])
        status[cid] = outcome
        rec: dict[str, Any] = {
            "kind": "result", "custom_id": cid, "line": int(cid[1:]) + 1, "attempt": attempt,
            "ok": outcome == "ok", "status_code": 200 if outcome == "ok" else 500, "body": None,
            "error": None if outcome == "ok" else {"code": rng.choice(["a", "b"]), "message": "m"},
            "retryable": outcome == "retry", "prompt_tokens": rng.randint(0, 9),
            "completion_tokens": rng.randint(0, 9), "latency_s": rng.choice([0.0, 0.01, 2.5]),
            "time": round(t, 3), "worker": rng.randint(0, 2),
        }  # fmt: skip
        rec.update(extra)
        return rec

    for _ in range(rng.randint(0, 3)):
        gen = rng.choice([None, generation, "other"])
        rec = {"kind": "invalid", "custom_id": None, "line": 0, "error": {"code": "x"}, "time": t}
        records.append(rec if gen is None else {**rec, "generation": gen})
    for _ in range(rng.randint(0, 4 * n)):
        fresh = [c for c in ids if c not in status]
        failed = [c for c in ids if status.get(c) in ("retry", "final")]
        action = rng.choice(["new", "new", "retry", "copy", "cached", "invalid"])
        if action == "retry" and failed:
            records.append(result(rng.choice(failed)))
        elif action == "copy" and len(fresh) >= 2:
            rep, dup = rng.sample(fresh, 2)
            rec = result(rep)
            records += [rec, {**result(dup, copy_of=rep), "ok": rec["ok"]}]
            status[dup] = status[rep]
        elif action == "cached" and fresh:
            rec = result(rng.choice(fresh), cached=True)
            records.append(rec)
        elif action == "invalid":
            gen = rng.choice([None, generation, "other"])
            rec = {
                "kind": "invalid",
                "custom_id": "x",
                "line": 0,
                "error": {"code": "y"},
                "time": t,
            }
            records.append(rec if gen is None else {**rec, "generation": gen})
        elif fresh:
            records.append(result(rng.choice(fresh)))
    return records


def counts(s: Any) -> dict[str, Any]:
    """What status shows of a state or summary: every count of its tally (job/tally.py: totals,
    per worker, per model), which each fold of the journal keeps with the same step."""
    return {"succeeded": s.succeeded, "failed": s.failed, **s.tally.dump()}


def exact(paths: JobPaths, m: Manifest) -> dict[str, Any]:
    """The counts of a full replay (one entry a request: the reference)."""
    state = replay(paths, m)
    return {**counts(state), "done": len(state.last), "attempts": sum(state.attempts.values())}


def folded(paths: JobPaths, m: Manifest) -> tuple[dict[str, Any], Summary]:
    s = current_summary(paths, m)
    return {**counts(s), "done": s.done, "attempts": s.attempts}, s


@pytest.mark.parametrize("seed", range(60))
def test_summary_plus_tail_is_the_full_replay_for_any_records_and_crash_point(
    tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    forced = rng.random() < 0.3
    n = rng.randint(1, 12)
    status: dict[str, str] = {}
    attempts: dict[str, int] = {}
    records = writer_records(rng, n, None, status=status, attempts=attempts)
    phase1 = len(records)
    paths = JobPaths(tmp_path / "job")
    paths.root.mkdir()
    before = after = manifest(n)
    if forced:  # a forced resume: some requests left the file; the rest run on
        kept = [(f"r{i}", i + 1) for i in range(n) if rng.random() < 0.7]
        name = write_input_map(paths, "g7", iter(kept))
        after = manifest(len(kept), input_map=InputMapRef(name, "g7"))
        ids = [cid for cid, _ in kept]
        records += writer_records(rng, n, "g7", ids, status, attempts)
    lines = [encode_records([r]) for r in records]
    # The summary as a writer saved it at a random record (under the manifest of that moment:
    # the forced resume's from its recount on), then more records, then a crash mid-line.
    cut = rng.randint(0, len(lines))
    paths.journal.write_bytes(b"".join(lines[:cut]))
    write_summary(paths, current_summary(paths, after if cut >= phase1 else before))
    torn = lines[-1][: rng.randint(1, len(lines[-1]) - 1)] if lines and rng.random() < 0.5 else b""
    paths.journal.write_bytes(b"".join(lines) + torn)
    m = after
    got, summary = folded(paths, m)
    assert got == exact(paths, m)
    assert summary.offset == len(b"".join(lines))
    starts = [RUN_START]
    # Latency, queue and errors of the same records the counts are of (job/figures.py): as a
    # rebuild from the whole journal folds them.
    assert summary.timing_of(starts).summary() == rebuild(paths, m).timing_of(starts).summary()


@pytest.mark.parametrize("seed", range(30))
def test_the_running_jobs_summary_is_the_fold_of_what_it_wrote(
    tmp_path: Path, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The keeper folds the bytes it is told were written (not read back): after every save,
    summary.json is what a full replay of the journal counts. A write it is not told of (a gap)
    sends it back to the file, and nothing is counted twice or missed."""
    monkeypatch.setattr(summary_module, "INTERVAL_S", 0.0)  # a save after every write
    rng = random.Random(seed)
    n = rng.randint(1, 12)
    records = writer_records(rng, n, None)
    paths = JobPaths(tmp_path / "job")
    paths.root.mkdir()
    head = rng.randint(0, len(records))  # already journaled when the keeper starts
    paths.journal.write_bytes(encode_records(records[:head]) if head else b"")
    m = manifest(n)
    starts = [RUN_START]
    journal = JournalWriter(paths.journal).open()
    keeper = SummaryKeeper(paths, m)
    journal.watcher = keeper
    gap_at = (
        rng.randint(head, len(records) - 1) if head < len(records) and rng.random() < 0.6 else -1
    )
    i = head
    while i < len(records):
        k = rng.randint(1, 5)
        batch = records[i : i + k]
        if i <= gap_at < i + k:
            # Written behind the keeper's back: it must not fold what follows from memory.
            journal.watcher = None
            journal.append(batch)
            journal.watcher = keeper
        else:
            journal.append(batch)
            saved = Summary.from_json(summary_path(paths).read_bytes())
            assert saved is not None
            assert saved.offset == journal.offset
            assert {**counts(saved), "done": saved.done, "attempts": saved.attempts} == exact(
                paths, m
            )
        i += k
    journal.close()
    saved = Summary.from_json(summary_path(paths).read_bytes())
    assert saved is not None and saved.offset == paths.journal.stat().st_size
    assert {**counts(saved), "done": saved.done, "attempts": saved.attempts} == exact(paths, m)
    assert saved.timing_of(starts).summary() == rebuild(paths, m).timing_of(starts).summary()
    # The check agrees with the file: status trusts this summary and folds no tail.
    assert folded(paths, m)[1].to_json() == saved.to_json()


def test_a_retry_before_any_failure_is_counted_by_a_full_replay(tmp_path: Path) -> None:
    # A journal not written by batchrun's rules (a succeeded request attempted again): the
    # fold cannot follow it, and the counts come from the replay, exactly.
    paths = JobPaths(tmp_path)
    recs = [
        {"kind": "result", "custom_id": "a", "attempt": 1, "ok": True, "time": 5.0},
        {"kind": "result", "custom_id": "a", "attempt": 2, "ok": False, "time": 6.0},
    ]
    paths.journal.write_bytes(encode_records(recs))
    m = manifest(1)
    got, _ = folded(paths, m)
    assert (got["succeeded"], got["failed"], got["done"]) == (0, 1, 1)
    assert got == exact(paths, m)


def echo_job(tmp_path: Path, n: int, prompt: str = "hi", **env: str) -> Path:
    src = write_jsonl(
        tmp_path / "in.jsonl",
        [chat_line(f"r{i}", f"{prompt} {i}", temperature=0) for i in range(n)],
    )
    job = tmp_path / "job"
    r = submit_echo(src, job, "--batch-size", "256", env=env)
    assert r.returncode in (0, 1), r.stderr
    return job


def test_a_finished_job_leaves_a_summary_of_its_whole_journal(tmp_path: Path) -> None:
    job = echo_job(tmp_path, 40, BATCHRUN_ECHO_FAIL="r3,r5")
    saved = Summary.from_json((job / SUMMARY_NAME).read_bytes())
    assert saved is not None
    assert saved.offset == (job / "journal.jsonl").stat().st_size
    assert (saved.done, saved.succeeded, saved.attempts) == (40, 38, 40 + 2 * 2)
    # retry-failed changes the failures' last state: the summary follows.
    r = rerun("retry-failed", job)
    assert r.returncode == 0, r.stderr
    s = status_json(job)
    assert s["requests"] == {
        "total": 40, "valid": 40, "succeeded": 40, "failed": 0, "invalid": 0, "pending": 0,
    }  # fmt: skip
    assert s["attempts"] == 46
    paths = JobPaths(job)
    m = load_manifest(paths)
    assert folded(paths, m)[0] == exact(paths, m)


def _io_read_bytes() -> int:
    """Bytes this process has read through read(2) so far (Linux's /proc/self/io rchar)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


def test_status_reads_the_summary_and_the_tail_not_the_whole_journal(tmp_path: Path) -> None:
    # (The bodies, prompts echoed, are in the workers' shards: the journal holds the rest.)
    job = echo_job(tmp_path, 3000, prompt="x" * 600)
    journal = job / "journal.jsonl"
    size = journal.stat().st_size
    assert size > 700_000
    job_status(job)  # imports and the like out of the way
    before = _io_read_bytes()
    s = job_status(job)
    read = _io_read_bytes() - before
    assert s["requests"]["succeeded"] == 3000
    assert read < 200_000, f"status read {read} bytes of a {size}-byte journal"
    # More results after the summary: status reads those only.
    lines = journal.read_bytes().splitlines(keepends=True)
    extra = [
        json.dumps({**json.loads(x), "custom_id": f"n{i}", "attempt": 1}).encode() + b"\n"
        for i, x in enumerate(lines[:50])
    ]
    with journal.open("ab") as f:
        f.writelines(extra)
    before = _io_read_bytes()
    s = job_status(job)
    read = _io_read_bytes() - before
    assert s["requests"]["succeeded"] == 3050
    assert read < 200_000 + sum(map(len, extra))
    # Without the summary status must read everything (the measure can tell): and saves one.
    (job / SUMMARY_NAME).unlink()
    before = _io_read_bytes()
    assert job_status(job)["requests"]["succeeded"] == 3050
    assert _io_read_bytes() - before >= size
    before = _io_read_bytes()
    job_status(job)
    assert _io_read_bytes() - before < 200_000


def damage_missing(paths: JobPaths) -> None:
    summary_path(paths).unlink()


def damage_torn(paths: JobPaths) -> None:
    data = summary_path(paths).read_bytes()
    summary_path(paths).write_bytes(data[: len(data) // 2])


def damage_beyond(paths: JobPaths) -> None:
    obj = json.loads(summary_path(paths).read_bytes())
    obj["offset"] += 1000
    summary_path(paths).write_text(json.dumps(obj))


def damage_other_journal(paths: JobPaths) -> None:
    # Same size, other bytes at the offset: another journal (a restored backup, say).
    obj = json.loads(summary_path(paths).read_bytes())
    obj["succeeded"] = 0
    summary_path(paths).write_text(json.dumps(obj))
    data = bytearray(paths.journal.read_bytes())
    i = data.rindex(b'"time":')
    data[i + 8] = ord("9") if data[i + 8] != ord("9") else ord("8")
    paths.journal.write_bytes(bytes(data))


def damage_version(paths: JobPaths) -> None:
    obj = json.loads(summary_path(paths).read_bytes())
    obj["version"] = 999
    obj["succeeded"] = 0
    summary_path(paths).write_text(json.dumps(obj))


@pytest.mark.parametrize(
    "damage",
    [damage_missing, damage_torn, damage_beyond, damage_other_journal, damage_version],
    ids=["missing", "torn", "offset-beyond-the-journal", "another-journal", "another-version"],
)
def test_a_summary_that_disagrees_with_the_journal_is_rebuilt(tmp_path: Path, damage: Any) -> None:
    paths = JobPaths(tmp_path)
    rng = random.Random(1)
    paths.journal.write_bytes(encode_records(writer_records(rng, 20, None)))
    m = manifest(20)
    save_manifest(paths, m)
    write_summary(paths, rebuild(paths, m))
    damage(paths)
    got, _ = folded(paths, m)
    assert got == exact(paths, m)
    # And the rebuilt summary was saved for the next reader.
    saved = Summary.from_json(summary_path(paths).read_bytes())
    assert saved is not None and saved.offset == paths.journal.stat().st_size


def test_a_summary_of_the_input_before_a_forced_resume_is_recounted(tmp_path: Path) -> None:
    paths = JobPaths(tmp_path)
    recs = [
        {"kind": "result", "custom_id": c, "attempt": 1, "ok": True, "time": 5.0}
        for c in ("gone", "kept")
    ]
    paths.journal.write_bytes(encode_records(recs))
    write_summary(paths, current_summary(paths, manifest(2)))
    name = write_input_map(paths, "g", iter([("kept", 1), ("new", 2)]))
    after = manifest(2, input_map=InputMapRef(name, "g"))
    got, s = folded(paths, after)
    assert (got["succeeded"], got["done"], s.generation) == (1, 1, "g")
    assert got == exact(paths, after)


def test_resume_force_recounts_into_the_summary(tmp_path: Path) -> None:
    job = echo_job(tmp_path, 10)
    src = tmp_path / "in.jsonl"
    lines = src.read_text().splitlines()
    # Four requests leave the file, two new ones come.
    new = [json.dumps(chat_line(f"n{i}", "new", temperature=0)) for i in range(2)]
    src.write_text("\n".join(lines[4:] + new) + "\n")
    r = rerun("resume", job, "--force")
    assert r.returncode == 0, r.stderr
    saved = Summary.from_json((job / SUMMARY_NAME).read_bytes())
    assert saved is not None and saved.generation is not None
    assert (saved.done, saved.succeeded) == (8, 8)
    s = status_json(job)
    assert s["requests"]["succeeded"] == 8 and s["requests"]["pending"] == 0


def test_status_of_a_job_copied_elsewhere_with_its_summary(tmp_path: Path) -> None:
    job = echo_job(tmp_path, 5)
    moved = shutil.copytree(job, tmp_path / "moved")
    assert status_json(Path(moved))["requests"]["succeeded"] == 5


@pytest.mark.slow
def test_status_while_the_job_runs_is_the_journal_up_to_where_it_read(tmp_path: Path) -> None:
    src = chat_input(tmp_path / "in.jsonl", 400, "p", temperature=0)
    job = tmp_path / "job"
    proc = start_echo(src, job, "--batch-size", "4", env={"BATCHRUN_ECHO_DELAY_MS": "20"})
    try:
        paths = JobPaths(job)
        wait_until(lambda: (job / SUMMARY_NAME).exists(), "the running job's first summary")
        wait_until(lambda: len(journal_lines(job)) >= 60, "60 results journaled")
        m = load_manifest(paths)
        s = current_summary(paths, m, save=False)
        state = replay(paths, m, end=s.offset)  # the journal as status read it
        assert 60 <= s.done < 400 and s.offset < paths.journal.stat().st_size + 1
        assert (s.done, s.succeeded, s.attempts) == (
            len(state.last),
            state.succeeded,
            sum(state.attempts.values()),
        )
    finally:
        proc.wait(timeout=120)
    assert status_json(job)["requests"]["succeeded"] == 400


def journal_lines(job: Path) -> list[bytes]:
    data = (job / "journal.jsonl").read_bytes() if (job / "journal.jsonl").exists() else b""
    return data.splitlines()


@pytest.mark.parametrize("block", [16, 300, 4096])
def test_the_fold_reads_in_blocks_any_size_of_line(
    tmp_path: Path, block: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = JobPaths(tmp_path)
    records = writer_records(random.Random(5), 30, None)
    paths.journal.write_bytes(encode_records(records) + b'{"kind":"resu')  # a torn tail
    m = manifest(30)
    whole = rebuild(paths, m)
    monkeypatch.setattr(summary_module, "_BLOCK", block)
    assert rebuild(paths, m) == whole
    assert whole.offset == len(encode_records(records))


@pytest.mark.slow
def test_bench_scale_runs_every_command_and_prints_the_table() -> None:
    script = str(ROOT / "scripts" / "bench.py")
    r = subprocess.run([sys.executable, script, "scale", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "--sizes" in r.stdout
    r = subprocess.run(
        [sys.executable, script, "scale", "--sizes", "30", "--no-docs"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    for phase in ("submit", "status", "resume", "retry-failed", "export --parquet"):
        assert re.search(rf"^\s*30\s+{re.escape(phase)}\s", r.stdout, re.M), r.stdout
    assert "(exit" not in r.stdout


def test_the_jobs_state_keeps_no_second_table_of_requests() -> None:
    n = 50_000
    outcomes = [Outcome(f"r{i:07d}", i % 10 != 0, 200, retryable=True) for i in range(n)]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        state = JobState()
        for i in range(0, n, 1024):
            state.record_results(outcomes[i : i + 1024], 0, 1.0)
        per_request = (tracemalloc.get_traced_memory()[0] - before) / n
    finally:
        tracemalloc.stop()
    # One dict entry a request (its last state); attempts only for those with more than one.
    assert per_request < 55, per_request
    retried = [o for o in outcomes if not o.ok][:100]
    state.record_results(retried, 0, 2.0)
    counts = Counter(o.custom_id for o in outcomes + retried)
    assert dict(state.attempts) == dict(counts)
    assert state.attempts.total() == n + 100 and state.attempts.get("nope", 0) == 0
