"""The journal's vectors stored once, as binary float32 in its side file (job/vectors.py): a
line with its vectors put back is, byte for byte, the line an earlier version journaled; export
of such a job writes the same bytes as export of its old-format copy; the side file costs 4
bytes a value; a kill -9, torn tails of both files, and a power cut that kept journal lines
but not their vectors lose nothing and run nothing twice; copies and the answer cache keep
whole answers."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import pytest
from support.jobs import journal_records, submit_echo
from support.lines import write_jsonl
from support.vectors import (
    each_answered_once_bit_for_bit,
    embedding_line,
    embedding_lines,
    embeddings_job_killed_mid_run,
    export_all,
    resume_recording,
    vector_of,
)

from batchrun.engines.echo import echo_vector_bytes
from batchrun.job.journal import JournalWriter, encode_record
from batchrun.job.journal_records import result_record
from batchrun.job.shards import ShardReader, restore, shards_dir
from batchrun.job.vectors import (
    VectorReader,
    VectorWriter,
    drop_unbacked,
    inline,
    vector_ref,
    vectors_path,
)
from batchrun.openai.records import EMBEDDINGS, Outcome, Request
from batchrun.openai.response_bodies import embedding_success
from batchrun.openai.vectors import PLACEHOLDER, fill_vectors, split_vectors
from batchrun.workers.child import _messages


def _outcome(cid: str, texts: list[str], *, base64_asked: bool = False) -> Outcome:
    """An echo-like embeddings outcome of one vector per text (its bytes known)."""
    body = {"model": "m", "input": texts}
    if base64_asked:
        body["encoding_format"] = "base64"
    request = Request(custom_id=cid, line=1, url=EMBEDDINGS, body=body)
    vectors = [echo_vector_bytes(t, 64) for t in texts]
    return embedding_success(request, vectors, model="m", prompt_tokens=3, latency_s=0.25)


def test_a_split_body_comes_back_as_the_same_bytes() -> None:
    outcome = _outcome("a", ["x", "y", "z"])
    assert isinstance(outcome.body, dict)
    whole = encode_record(outcome.body)
    split = split_vectors(outcome.body)
    assert split is not None
    rest, vectors = split
    assert vectors == [echo_vector_bytes(t, 64) for t in ("x", "y", "z")]
    part = encode_record(rest)
    assert part.count(PLACEHOLDER) == 3 and b'embedding":""' in part
    assert fill_vectors(part, vectors) == whole
    with pytest.raises(ValueError):
        fill_vectors(part, vectors[:2])


def test_a_body_whose_base64_would_not_come_back_the_same_stays_whole() -> None:
    # "AAA=" and "AAB=" decode alike: only canonical base64 is split (its text is recomputed).
    body = {"object": "list", "data": [{"object": "embedding", "index": 0, "embedding": "AAB="}]}
    assert split_vectors(body) is None
    assert split_vectors({"object": "list", "data": [{"embedding": "not base64!"}]}) is None
    assert split_vectors({"object": "chat.completion", "choices": []}) is None
    floats = {"object": "list", "data": [{"object": "embedding", "embedding": [0.5]}]}
    assert split_vectors(floats) is None


def test_a_journaled_line_with_its_vectors_put_back_is_the_old_line(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    outcomes = [_outcome("a", ["x", "y"]), _outcome("b", ["z"], base64_asked=True)]
    old = [encode_record(result_record(o, 1, 1, now=5.0)) for o in outcomes]
    # As a worker sends them: bodies pre-encoded, vectors split out.
    (sent,) = _messages([_outcome("a", ["x", "y"]), _outcome("b", ["z"], base64_asked=True)])
    assert all(o.vectors is not None for o in sent)
    with JournalWriter(path) as journal:
        journal.append([result_record(o, 1, 1, now=5.0) for o in sent], plain=True)
    lines_ = path.read_bytes().splitlines(keepends=True)
    assert [vector_ref(x) for x in lines_] == [(0, [256, 256]), (512, [256])]
    assert vectors_path(path).read_bytes() == b"".join(
        echo_vector_bytes(t, 64) for t in ("x", "y", "z")
    )
    with VectorReader(path) as reader:
        assert [inline(x, reader) for x in lines_] == old
    assert b"base64" not in path.read_bytes() and len(path.read_bytes()) < sum(map(len, old))


def test_the_side_file_takes_many_vectors_and_short_writes_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    chunks = [bytes([i % 251]) * (4 * (1 + i % 7)) for i in range(2500)]  # over IOV_MAX
    writer = VectorWriter(tmp_path / "journal.f32")
    assert writer.write(chunks) == 0
    real = os.writev
    calls: list[int] = []

    def short(fd: int, buffers: list[bytes]) -> int:
        """A write the kernel cut short: at most 10 bytes, mid-vector."""
        calls.append(len(buffers))
        return real(fd, [bytes(b"".join(bytes(b) for b in buffers)[:10])])

    monkeypatch.setattr(os, "writev", short)
    assert writer.write(chunks[:5]) == sum(map(len, chunks))
    writer.close()
    assert (tmp_path / "journal.f32").read_bytes() == b"".join(chunks + chunks[:5])
    assert len(calls) > 1


def test_a_power_cut_that_kept_lines_but_not_their_vectors_cuts_the_journal_there(
    tmp_path: Path,
) -> None:
    path = tmp_path / "journal.jsonl"
    chat = Outcome(custom_id="c", ok=True, status_code=200, body={"object": "chat.completion"})
    first, second = (_messages([_outcome(cid, ["v"])])[0][0] for cid in ("a", "b"))
    with JournalWriter(path) as journal:
        journal.append([result_record(first, 1, 1)])
        journal.append([result_record(chat, 2, 1)])
        keep = journal.offset
        journal.append([result_record(second, 3, 1)])
        journal.append([result_record(chat, 4, 1)])
    side = vectors_path(path)
    with side.open("r+b") as f:
        f.truncate(256 + 100)  # the second record's vectors only partly written back
    assert drop_unbacked(path) > 0
    assert path.stat().st_size == keep
    assert [r["custom_id"] for r in journal_records(tmp_path)] == ["a", "c"]
    assert drop_unbacked(path) == 0  # nothing more to cut
    # The writer does the same on open, and appends after what the side file holds.
    with JournalWriter(path) as journal:
        journal.append([result_record(second, 3, 1)])
    assert [r["custom_id"] for r in journal_records(tmp_path)] == ["a", "c", "b"]
    assert journal_records(tmp_path)[2]["body"]["data"][0]["embedding"] == base64.b64encode(
        echo_vector_bytes("v", 64)
    ).decode("ascii")


def test_export_of_a_job_is_the_same_bytes_as_of_its_old_format_copy(tmp_path: Path) -> None:
    # Float and base64 requests, several inputs to a line, and duplicates (copies of answers).
    rows = [*embedding_lines(30, 256), embedding_line("multi", "a", dimensions=256)]
    rows[-1]["body"]["input"] = ["one", "two", "three"]
    rows += [{**embedding_line(f"dup{i}", "passage 3", dimensions=256)} for i in range(3)]
    rows[-1]["body"]["encoding_format"] = "base64"
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    new = tmp_path / "new"
    run = submit_echo(src, new)
    assert run.returncode == 0, run.stderr
    raw = (new / "journal.jsonl").read_bytes()
    # Each record names where its vectors are: its worker's shard, or (a copy the parent made
    # for a duplicate) the journal's side file.
    assert raw.count(b'"shard":[') + raw.count(b'"vectors":[') == len(rows)
    assert b'"shard":[' in raw and (new / "journal.f32").exists()
    copies = [r for r in journal_records(new) if "copy_of" in r]
    assert len(copies) >= 2  # the duplicates were answered by copies, with their own vectors
    old = tmp_path / "old"
    old.mkdir()
    (old / "manifest.json").write_bytes((new / "manifest.json").read_bytes())
    with VectorReader(new / "journal.jsonl") as reader, ShardReader(shards_dir(new)) as shards:
        (old / "journal.jsonl").write_bytes(
            b"".join(restore(x, reader, shards) for x in raw.splitlines(keepends=True))
        )
    assert b'"vectors":[' not in (old / "journal.jsonl").read_bytes()
    by_new, _ = export_all(new)
    export_all(old)
    for name in ("output.jsonl", "errors.jsonl", "results.parquet"):
        assert (new / name).read_bytes() == (old / name).read_bytes(), name
    assert vector_of(by_new["dup0"]) == echo_vector_bytes("passage 3", 256)
    assert vector_of(by_new["multi"], 2) == echo_vector_bytes("three", 256)


def test_the_journal_and_its_shards_hold_at_most_1_15x_the_vectors_bytes(
    tmp_path: Path,
) -> None:
    n = 200
    src = write_jsonl(tmp_path / "in.jsonl", embedding_lines(n))
    job = tmp_path / "job"
    run = submit_echo(src, job)
    assert run.returncode == 0, run.stderr
    vectors = n * 1024 * 4
    shards = list(shards_dir(job).glob("*.res"))  # the workers' bodies, their vectors once
    assert shards
    assert not (job / "journal.f32").exists()  # no duplicates: the parent wrote no vectors
    held = (job / "journal.jsonl").stat().st_size + sum(p.stat().st_size for p in shards)
    assert held <= 1.15 * vectors, held / vectors


def test_a_kill_9_with_torn_tails_of_both_files_resumes_exactly_once(tmp_path: Path) -> None:
    n = 600
    job, done = embeddings_job_killed_mid_run(tmp_path, n)
    journal, side = job / "journal.jsonl", job / "journal.f32"
    # A kill between the two writes of one more append: its vectors half in the side file,
    # its line half in the journal.
    whole = journal.read_bytes()
    last = whole[whole.rstrip(b"\n").rfind(b"\n") + 1 :]
    with side.open("ab") as f:
        f.write(os.urandom(6000))
    with journal.open("ab") as f:
        f.write(last[: len(last) // 2])
    assert not set(resume_recording(tmp_path, job, whole)) & done  # nothing journaled ran again
    each_answered_once_bit_for_bit(job, n)


def test_a_kill_9_with_torn_shard_tails_resumes_exactly_once(tmp_path: Path) -> None:
    n = 600
    job, done = embeddings_job_killed_mid_run(tmp_path, n)
    journal = job / "journal.jsonl"
    whole = journal.read_bytes()
    # A worker killed mid-write: bytes past what any record names, in every shard; and a line
    # the parent was writing, half of it.
    shards = sorted(shards_dir(job).glob("*.res"))
    assert shards
    for shard in shards:
        with shard.open("ab") as f:
            f.write(os.urandom(5000))
    last = whole[whole.rstrip(b"\n").rfind(b"\n") + 1 :]
    with journal.open("ab") as f:
        f.write(last[: len(last) // 2])
    assert not set(resume_recording(tmp_path, job, whole)) & done  # nothing journaled ran again
    # The resumed workers wrote shards of their own: no file was appended to after garbage.
    assert len(list(shards_dir(job).glob("*.res"))) > len(shards)
    each_answered_once_bit_for_bit(job, n)


def test_the_answer_cache_keeps_whole_answers_of_split_vectors(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", embedding_lines(6, 128))
    cache = tmp_path / "cache"
    jobs = [tmp_path / "first", tmp_path / "second"]
    for job in jobs:
        run = submit_echo(src, job, "--cache-dir", str(cache))
        assert run.returncode == 0, run.stderr
    entries = list(cache.rglob("*.json"))
    assert len(entries) == 6 and all(b'"embedding":""' not in e.read_bytes() for e in entries)
    hits = [r for r in journal_records(jobs[1]) if r.get("cached")]
    assert len(hits) == 6
    outputs, _ = export_all(jobs[1])
    for i in range(6):
        assert vector_of(outputs[f"e{i}"]) == echo_vector_bytes(f"passage {i}", 128)
