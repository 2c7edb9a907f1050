"""--cache-dir: answers reused across jobs (run/answer_cache.py), and `batchrun cache`."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from support.cli import cli
from support.jobs import journal_records, rerun, start_echo, status_json, submit_echo
from support.lines import chat_line, write_jsonl
from support.processes import kill_9_after
from support.serving import start_server, stop_server, wait_done
from testmodels.multimodal import wav_bytes

from batchrun.config import EngineSettings
from batchrun.engines.echo import EchoEngine
from batchrun.openai.answers import answer_problem
from batchrun.openai.records import Outcome, Request

IDS = [f"r{i}" for i in range(8)]


def lines(sampled: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Chat requests, greedy (deterministic) unless named in `sampled`."""
    return [chat_line(cid, f"prompt {cid}", temperature=1 if cid in sampled else 0) for cid in IDS]


def submit(tmp_path: Path, name: str, cache: Path, **env: str) -> tuple[Path, Any]:
    src = tmp_path / "in.jsonl"
    if not src.exists():
        write_jsonl(src, lines(sampled=("r6", "r7")))
    job = tmp_path / name
    r = submit_echo(src, job, "--cache-dir", str(cache), env=env)
    return job, r


def by_id(job: Path) -> dict[str, dict[str, Any]]:
    return {rec["custom_id"]: rec for rec in journal_records(job)}


def entry_files(cache: Path) -> list[Path]:
    return sorted(p for p in (cache / "answers-v1").glob("*/*.json") if not p.name.startswith("."))


def test_hits_misses_and_sampled_requests(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first, r = submit(tmp_path, "j1", cache)
    assert r.returncode == 0, r.stderr
    assert len(entry_files(cache)) == 6  # r6, r7 are sampled: never stored
    # Every request the engine sees now fails: the hits do not reach it, the sampled ones do.
    second, r = submit(tmp_path, "j2", cache, BATCHRUN_ECHO_FAIL=",".join(IDS))
    assert r.returncode == 1
    recs = by_id(second)
    assert {cid for cid, rec in recs.items() if rec.get("cached")} == set(IDS[:6])
    assert all(recs[c]["ok"] for c in IDS[:6])
    assert not recs["r6"]["ok"] and not recs["r7"]["ok"] and "cached" not in recs["r6"]
    # The same answer, under its own ids.
    old = by_id(first)["r0"]["body"]
    new = recs["r0"]["body"]
    assert new["choices"] == old["choices"] and new["id"] != old["id"]
    s = status_json(second)
    assert s["cache_hits"] == 6
    assert s["requests"]["succeeded"] == 6 and s["requests"]["failed"] == 2


def test_a_corrupt_or_foreign_entry_is_a_miss_and_is_replaced(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    submit(tmp_path, "j1", cache)
    entries = entry_files(cache)
    entries[0].write_bytes(entries[0].read_bytes()[:20])  # torn
    foreign = json.loads(entries[1].read_bytes())
    foreign["batchrun"] = "0.0.0-other"
    entries[1].write_text(json.dumps(foreign))
    entries[2].write_bytes(b"")
    job, r = submit(tmp_path, "j2", cache)
    assert r.returncode == 0, r.stderr
    recs = by_id(job)
    assert sum(1 for rec in recs.values() if rec.get("cached")) == 3
    # Replaced by the answers that ran: a third job hits all six.
    job, r = submit(tmp_path, "j3", cache, BATCHRUN_ECHO_FAIL=",".join(IDS[:6]))
    assert r.returncode == 0, r.stderr
    assert sum(1 for rec in by_id(job).values() if rec.get("cached")) == 6


def test_an_entry_tampered_to_no_answer_is_a_miss_and_runs(tmp_path: Path) -> None:
    """Valid JSON of the right version and key, but no answer an engine would give (no choices,
    a failure's status, another endpoint's object): the request runs, never a 200 without an
    answer; the answer that ran replaces the entry."""
    cache = tmp_path / "cache"
    submit(tmp_path, "j1", cache)
    entries = entry_files(cache)
    tampers = [
        lambda e: e["body"].update(choices=[]),
        lambda e: e["body"].update(choices=[{"index": 0}]),
        lambda e: e.update(status_code=500),
        lambda e: e["body"].update(object="text_completion"),
    ]
    for path, tamper in zip(entries, tampers, strict=False):
        entry = json.loads(path.read_bytes())
        tamper(entry)
        path.write_text(json.dumps(entry))
    job, r = submit(tmp_path, "j2", cache)
    assert r.returncode == 0, r.stderr
    recs = by_id(job)
    assert sum(1 for rec in recs.values() if rec.get("cached")) == 6 - len(tampers)
    assert all(rec["ok"] and rec["body"]["choices"] for rec in recs.values())
    for path in entries[: len(tampers)]:
        entry = json.loads(path.read_bytes())
        assert (
            entry["status_code"] == 200
            and answer_problem("/v1/chat/completions", entry["body"]) is None
        )


WAV_URL = "data:audio/wav;base64," + base64.b64encode(wav_bytes(0.1, 440)).decode()
ANSWERED = {
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}]},
    "/v1/completions": {"prompt": "hi"},
    "/v1/embeddings": {"input": ["a", "b"]},
    "/v1/responses": {"input": "hi"},
    "/v1/score": {"text_1": "a cat", "text_2": ["a cat", "a dog"]},
    "/v1/rerank": {"query": "a cat", "documents": ["a dog", "a cat"]},
    "/v1/audio/transcriptions": {"file_url": WAV_URL},
}


@pytest.mark.parametrize("url", sorted(ANSWERED))
def test_an_engines_answer_of_each_endpoint_passes_the_cache_s_check(url: str) -> None:
    """The check a cached body must pass (openai/answers.py) is what an engine's answer is:
    the echo engine's (built by the same code as vLLM's) passes it; the same answer emptied
    does not."""
    engine = EchoEngine(EngineSettings(engine="echo", model_name="m"))
    assert engine.add(Request("r", 1, url, {"model": "m", **ANSWERED[url]})) is None
    (outcome,) = engine.step()
    assert isinstance(outcome, Outcome) and outcome.ok and isinstance(outcome.body, dict)
    body = outcome.body
    assert answer_problem(url, body) is None, body
    part = next((k for k in ("choices", "data", "output", "results") if k in body), "text")
    emptied = {**body, part: [] if part != "text" else None}
    if part != "results":  # a rerank of top_n documents may list none
        assert answer_problem(url, emptied) is not None
    assert answer_problem(url, "not an object") == "the answer is not a JSON object"


def test_a_cache_dir_that_cannot_be_made_is_one_line_before_the_job(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    job, r = submit(tmp_path, "j1", blocker / "cache")
    assert r.returncode == 1
    assert r.stderr.strip().splitlines()[-1] == (
        f"error: --cache-dir {blocker / 'cache'} cannot be used: Not a directory; "
        "give a directory you can write to"
    )
    assert "Traceback" not in r.stderr
    assert not job.exists()


def test_a_kill_between_journal_and_cache_answers_each_request_once(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    src = write_jsonl(
        tmp_path / "in.jsonl", [chat_line(f"k{i}", f"p{i}", temperature=0) for i in range(60)]
    )
    job = tmp_path / "job"
    proc = start_echo(
        src,
        job,
        "--batch-size",
        "4",
        "--cache-dir",
        str(cache),
        env={"BATCHRUN_ECHO_DELAY_MS": "20"},
    )
    kill_9_after(proc, job, 10)
    r = rerun("resume", job, "--cache-dir", str(cache))
    assert r.returncode == 0, r.stderr
    recs = journal_records(job)
    ids = [rec["custom_id"] for rec in recs]
    assert sorted(ids) == sorted(f"k{i}" for i in range(60))  # each answered exactly once
    # Every answer journaled is in the cache (or was journaled before it could be stored),
    # and a new job over the same input is answered from it alone.
    again = tmp_path / "again"
    r = submit_echo(
        src, again, "--cache-dir", str(cache), env={"BATCHRUN_ECHO_FAIL": ",".join(ids)}
    )
    records = journal_records(again)
    cached = [rec["custom_id"] for rec in records if rec.get("cached")]
    assert len(cached) >= 60 - 4 * 3  # at most what the killed run held between its two writes
    # Each cached answer once; a request the kill kept out of the cache ran on the engine and
    # failed (BATCHRUN_ECHO_FAIL), attempt after attempt: it was never answered from the cache.
    assert len(set(cached)) == len(cached)
    assert {rec["custom_id"] for rec in records} == {f"k{i}" for i in range(60)}
    missed = {rec["custom_id"] for rec in records if not rec.get("cached")}
    assert not missed & set(cached) and all(
        not rec["ok"] for rec in records if not rec.get("cached")
    )


def test_cache_stats_and_prune(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    submit(tmp_path, "j1", cache)
    r = cli("cache", "stats", "--cache-dir", str(cache), "--json")
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert s["entries"] == 6 and s["bytes"] > 0
    r = cli("cache", "prune", "--cache-dir", str(cache), "--older-than", "30d")
    assert r.returncode == 0 and r.stdout.startswith("removed 0 answers")
    r = cli("cache", "prune", "--cache-dir", str(cache), "--older-than", "0s")
    assert r.returncode == 0 and r.stdout.startswith("removed 6 answers")
    assert entry_files(cache) == []
    r = cli("cache", "prune", "--cache-dir", str(cache), "--older-than", "soon")
    assert r.returncode == 2


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (lambda p: p.write_text("not a cache\n"), "it is a file, not a directory"),
        (lambda p: None, "it does not exist"),
        (lambda p: p.mkdir(), "it holds no answers-v1/ (a job given --cache-dir {p} makes it)"),
    ],
    ids=["file", "missing", "other-directory"],
)
@pytest.mark.parametrize("command", [("stats",), ("stats", "--json"), ("prune", "--older-than", "0s")])  # fmt: skip
def test_cache_commands_refuse_what_is_not_a_cache(
    tmp_path: Path, make: Any, why: str, command: tuple[str, ...]
) -> None:
    """Not "0 answers" for a typo: one line naming the path and why, exit 2, nothing touched."""
    path = tmp_path / "cache"
    make(path)
    before = sorted(tmp_path.rglob("*"))
    r = cli("cache", command[0], "--cache-dir", str(path), *command[1:])
    assert (r.returncode, r.stdout, r.stderr) == (
        2,
        "",
        f"error: --cache-dir {path} is not an answer cache: {why.format(p=path)}\n",
    )
    assert sorted(tmp_path.rglob("*")) == before


@pytest.mark.slow
def test_serve_answers_a_later_batch_from_the_cache(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    server = start_server(tmp_path / "root", "--cache-dir", str(cache))
    try:
        client = server.client()
        src = write_jsonl(tmp_path / "in.jsonl", lines(sampled=("r6", "r7")))
        ids = []
        for _ in range(2):
            with src.open("rb") as f:
                uploaded = client.files.create(file=f, purpose="batch")
            batch = client.batches.create(
                input_file_id=uploaded.id,
                endpoint="/v1/chat/completions",
                completion_window="24h",
            )
            assert wait_done(client, batch.id).status == "completed"
            ids.append(batch.id)
        first, second = (by_id(server.batch_dir(b)) for b in ids)
        assert not any(rec.get("cached") for rec in first.values())
        assert {cid for cid, rec in second.items() if rec.get("cached")} == set(IDS[:6])
        assert second["r0"]["body"]["choices"] == first["r0"]["body"]["choices"]
        assert status_json(server.batch_dir(ids[1]))["cache_hits"] == 6
    finally:
        stop_server(server)


@pytest.mark.slow
def test_two_jobs_at_once_share_one_cache(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    src = write_jsonl(
        tmp_path / "in.jsonl", [chat_line(f"c{i}", f"p{i}", temperature=0) for i in range(200)]
    )
    procs = [
        start_echo(src, tmp_path / f"j{k}", "--batch-size", "8", "--cache-dir", str(cache))
        for k in range(2)
    ]
    assert [p.wait(timeout=300) for p in procs] == [0, 0]
    for k in range(2):
        recs = journal_records(tmp_path / f"j{k}")
        assert sorted(r["custom_id"] for r in recs) == sorted(f"c{i}" for i in range(200))
        assert all(r["ok"] for r in recs)
    entries = entry_files(cache)
    assert len(entries) == 200
    assert all(json.loads(p.read_bytes())["key"] == p.stem for p in entries)
    assert not [p for p in (cache / "answers-v1").glob("*/.*")]  # no temp file left
