"""Result shards (job/shards.py): a journal whose bodies are in the workers' shards reads back,
byte for byte, as the same journal with its bodies inline (and its vectors in the side file);
export writes the same files from both; a shard truncated or removed is one line of error; bytes
of a shard that no record names are never read; a record cannot name a file outside shards/."""

from __future__ import annotations

import copy
import math
import os
import struct
from pathlib import Path
from typing import Any

import msgspec
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support.cli import run_cli

from batchrun.engines.echo import echo_vector_bytes
from batchrun.errors import BatchrunError
from batchrun.export.job import export_job
from batchrun.job.journal import JournalWriter
from batchrun.job.journal_records import ResultRecord, result_record
from batchrun.job.paths import JobPaths
from batchrun.job.shards import (
    OPEN_SHARDS,
    ShardReader,
    ShardRef,
    ShardWriter,
    restore,
    shard_path,
    shard_ref,
    shards_dir,
)
from batchrun.job.vectors import VectorReader, vectors_path
from batchrun.openai.records import EMBEDDINGS, Outcome, Request
from batchrun.openai.response_bodies import embedding_success
from batchrun.run.inputs import refuse_input_among_job_files
from batchrun.workers.child import encode_outcome

_NOW = 1_700_000_000.125


def _chat_body(cid: str, text: str, *, logprobs: bool = False) -> dict[str, Any]:
    """A ChatCompletion as an engine makes one (its ids fixed, so two journals can match)."""
    message: dict[str, Any] = {"role": "assistant", "content": text, "reasoning": None}
    return {
        "id": f"chatcmpl-{cid.encode().hex():0>8}",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": message,
                # 1e-05: a float json and msgspec write differently (journal._may_differ)
                "logprobs": {"content": [{"token": "x", "logprob": -1e-05}]} if logprobs else None,
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8},
    }


def _embeddings(cid: str, vectors: list[bytes], *, base64_asked: bool = False) -> Outcome:
    body: dict[str, Any] = {"model": "m", "input": ["t"] * len(vectors)}
    if base64_asked:
        body["encoding_format"] = "base64"
    request = Request(custom_id=cid, line=1, url=EMBEDDINGS, body=body)
    return embedding_success(request, vectors, model="m", prompt_tokens=3, latency_s=0.25)


def _outcomes() -> list[Outcome]:
    """A job's outcomes as engines give them: chat, embeddings (floats asked, base64 asked, one
    with NaN and infinities), a failure; not yet encoded by a worker."""
    odd = struct.pack("<16f", 1.5, math.nan, -math.inf, *[0.25] * 13)
    chats = [
        Outcome("chat-a", True, 200, body=_chat_body("a", "hello"), prompt_tokens=3),
        Outcome("chat-ü", True, 200, body=_chat_body("b", "naïve ✓", logprobs=True)),
        Outcome('chat-q"body":null', True, 200, body=_chat_body("c", '"body":null')),
    ]
    vectors = [
        _embeddings("emb-a", [echo_vector_bytes("x", 16), echo_vector_bytes("y", 16)]),
        _embeddings("emb-b", [echo_vector_bytes("z", 16)], base64_asked=True),
        _embeddings("emb-nan", [odd]),
    ]
    failed = Outcome(
        "failed", False, 500, error={"code": "engine_error", "message": "boom"}, retryable=True
    )
    for o in (*chats, *vectors):
        o.latency_s = 0.01
    return [*chats, *vectors, failed]


def _sent(outcomes: list[Outcome]) -> list[Outcome]:
    """The outcomes as a worker sends them: bodies pre-encoded, vectors split out."""
    sent = copy.deepcopy(outcomes)
    for o in sent:
        if isinstance(o.body, dict):
            o.body = encode_outcome(o, o.body)
    return sent


def _records(sent: list[Outcome]) -> list[ResultRecord]:
    records = []
    for line, o in enumerate(sent, start=1):
        rec = result_record(o, line, 1, now=_NOW)
        rec["worker"] = 0
        if line % 2:
            rec["model"] = "m"  # (a job of several models: the field before `shard`)
        if o.stored is not None:
            rec["shard"] = o.stored  # type: ignore[typeddict-unknown-key]  # last, as the parent
        records.append(rec)
    return records


def _inline_job(job: Path, outcomes: list[Outcome]) -> Path:
    """(a) The journal as today's writer keeps it: bodies inline, vectors in the side file."""
    job.mkdir()
    with JournalWriter(job / "journal.jsonl") as journal:
        journal.append(_records(_sent(outcomes)))
    return job


def _shard_job(job: Path, outcomes: list[Outcome], name: str = "w0-0123456789ab") -> Path:
    """(b) The same outcomes with their bodies (and vectors) in a worker's shard."""
    job.mkdir()
    sent = _sent(outcomes)
    writer = ShardWriter(shards_dir(job), name)
    assert writer.store(sent) == 6  # the failure has no body: it travels whole
    writer.sync()
    writer.close()
    with JournalWriter(job / "journal.jsonl") as journal:
        journal.append(_records(sent))
    return job


@pytest.fixture
def jobs(tmp_path: Path) -> tuple[Path, Path]:
    outcomes = _outcomes()
    return _inline_job(tmp_path / "a", outcomes), _shard_job(tmp_path / "b", outcomes)


def _lines(job: Path) -> list[bytes]:
    return (job / "journal.jsonl").read_bytes().splitlines(keepends=True)


def test_a_shard_line_restored_is_the_line_journaled_inline(jobs: tuple[Path, Path]) -> None:
    a, b = jobs
    assert vectors_path(a / "journal.jsonl").exists()
    assert not vectors_path(b / "journal.jsonl").exists()  # the vectors are in the shard
    shard_lines = _lines(b)
    assert sum(b'"body":null' in x and shard_ref(x) is not None for x in shard_lines) == 6
    first = shard_ref(shard_lines[0])
    assert first is not None and first.at == 0 and first.vectors == []
    assert shard_lines[0].endswith(b',"model":"m","shard":["w0-0123456789ab",0,%d]}\n' % first.body)
    with (
        VectorReader(a / "journal.jsonl") as va,
        VectorReader(b / "journal.jsonl") as vb,
        ShardReader(shards_dir(b)) as shards,
        ShardReader(shards_dir(a)) as none,
    ):
        old = [restore(x, va, none) for x in _lines(a)]
        assert [restore(x, vb, shards) for x in shard_lines] == old
    # What an earlier version wrote: whole bodies, base64 vectors, no field of this one's.
    assert all(b'"body":null' not in x or b'"ok":false' in x for x in old)
    assert all(b'"shard"' not in x and b'"vectors":[' not in x for x in old)


def test_export_of_a_sharded_journal_writes_the_same_files(jobs: tuple[Path, Path]) -> None:
    a, b = jobs
    for job in jobs:
        export_job(job, job, partial=True)
        export_job(job, job, parquet=True, partial=True)
    for name in ("output.jsonl", "errors.jsonl"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    assert len((a / "output.jsonl").read_bytes().splitlines()) == 6
    schema_a, schema_b = (pq.read_schema(j / "results.parquet") for j in jobs)
    assert schema_a.equals(schema_b)
    assert "logprobs" in schema_a.names
    # The sizes of the vectors in the shard: each 16 values (the index's, from the records).
    assert schema_a.field("embeddings").type == pa.list_(pa.list_(pa.float32(), 16))
    rows_a, rows_b = (pd.read_parquet(j / "results.parquet") for j in jobs)
    pd.testing.assert_frame_equal(rows_a, rows_b)


def test_a_shard_truncated_or_removed_is_one_line_of_error(jobs: tuple[Path, Path]) -> None:
    _, b = jobs
    (shard,) = shards_dir(b).iterdir()
    size = shard.stat().st_size
    with shard.open("r+b") as f:
        f.truncate(size - 1)  # the last vector's last byte
    with pytest.raises(BatchrunError) as cut:
        export_job(b, b, partial=True)
    assert str(cut.value) == (
        f"the result shard {shard} ends before the result the journal names (byte {size}): "
        "it was truncated; restore it from a backup"
    )
    run = run_cli("export", "--job-dir", str(b), "--partial")
    assert run.returncode != 0
    assert "Traceback" not in run.stderr and str(cut.value) in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1, run.stderr
    shard.unlink()
    for parquet in (False, True):  # the index's pass reads the shard as export's does
        with pytest.raises(BatchrunError, match="it was removed; restore it from a backup"):
            export_job(b, b, parquet=parquet, partial=True)
    run = run_cli("export", "--job-dir", str(b), "--partial", "--parquet")
    assert run.returncode != 0 and "Traceback" not in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert f"cannot read the result shard {shard}" in run.stderr


def test_bytes_no_record_names_are_never_read(tmp_path: Path, jobs: tuple[Path, Path]) -> None:
    a, b = jobs
    (shard,) = shards_dir(b).iterdir()
    # A torn tail (a worker killed mid-write) and a result the parent never heard of.
    with shard.open("ab") as f:
        f.write(b'{"id":"chatcmpl-orphan","object":"chat.completion"}' + b"\x00" * 7)
    # An orphan: a shard no record names, which cannot be read at all (a directory).
    (shards_dir(b) / "w1-0123456789ab.res").mkdir()
    for job in jobs:
        export_job(job, job, partial=True)
        export_job(job, job, parquet=True, partial=True)
    assert (a / "output.jsonl").read_bytes() == (b / "output.jsonl").read_bytes()
    pd.testing.assert_frame_equal(
        pd.read_parquet(a / "results.parquet"), pd.read_parquet(b / "results.parquet")
    )


def test_fill_gives_an_outcome_its_body_and_vectors_back(tmp_path: Path) -> None:
    sent = _sent(_outcomes())
    stored = copy.deepcopy(sent)
    writer = ShardWriter(tmp_path / "shards", "w3-abc")
    writer.store(stored)
    writer.sync()
    writer.close()
    assert all(o.body is None and o.vectors is None for o in stored if o.stored is not None)
    with ShardReader(tmp_path / "shards") as reader:
        for o in stored:
            reader.fill(o)
    assert stored == sent
    assert all(type(o.body) is msgspec.Raw for o in stored if o.ok)
    assert [o.vectors is not None for o in stored] == [False] * 3 + [True] * 3 + [False]


def _named(job: Path, name: str) -> None:
    """Make the journal's first shard record name `name`."""
    path = job / "journal.jsonl"
    lines = _lines(job)
    lines[0] = lines[0].replace(b'"shard":["w0-0123456789ab"', b'"shard":["' + name.encode() + b'"')
    path.write_bytes(b"".join(lines))


@pytest.mark.parametrize("name", ["../x", "w0/../../etc", "", "a b"])
def test_a_record_naming_a_file_outside_the_shards_is_refused(
    jobs: tuple[Path, Path], name: str
) -> None:
    _, b = jobs
    _named(b, name)
    with pytest.raises(BatchrunError, match="which is no name"):
        shard_ref(_lines(b)[0])
    for parquet in (False, True):
        with pytest.raises(BatchrunError, match="which is no name"):
            export_job(b, b, parquet=parquet, partial=True)
    run = run_cli("export", "--job-dir", str(b), "--partial")
    assert run.returncode != 0 and "Traceback" not in run.stderr
    with pytest.raises(BatchrunError):
        shard_path(shards_dir(b), name)


def test_shard_ref_reads_only_the_records_own_last_field() -> None:
    line = b'{"kind":"result","body":null,"model":"m","shard":["w0-ab",12,34,8,4]}\n'
    assert shard_ref(line) == ShardRef("w0-ab", 12, 34, [8, 4])
    assert ShardRef("w0-ab", 12, 34, [8, 4]).size == 46
    # A side-file record, whose body happens to hold the field's text, names no shard.
    body = b'{"x":{"shard":["w0-ab",1,2]}}'
    assert shard_ref(b'{"kind":"result","body":' + body + b',"vectors":[0,4]}\n') is None
    assert shard_ref(b'{"kind":"result","body":' + body + b"}\n") is None
    assert shard_ref(b'{"kind":"result","shard":["w0-ab",1]}\n') is None
    assert shard_ref(b'{"kind":"result","shard":["w0-ab",1,,2]}\n') is None
    assert shard_ref(b'{"kind":"result","vectors":[0,4]}\n') is None


def test_an_input_among_the_shards_is_refused(tmp_path: Path) -> None:
    (tmp_path / "shards").write_text("{}\n")  # where the workers' folder would be
    with pytest.raises(BatchrunError, match="lies where the job keeps its own shards,"):
        refuse_input_among_job_files(tmp_path / "shards", JobPaths(tmp_path))
    (tmp_path / "shards").unlink()
    (tmp_path / "shards").mkdir()
    (tmp_path / "shards" / "in.jsonl").write_text("{}\n")
    with pytest.raises(BatchrunError, match=r"lies where the job keeps its own shards/in\.jsonl"):
        refuse_input_among_job_files(tmp_path / "shards" / "in.jsonl", JobPaths(tmp_path))


def test_a_reader_of_many_shards_keeps_few_files_open(tmp_path: Path) -> None:
    # A long job whose workers died many times: a shard each, read back and forth by export.
    directory = tmp_path / "shards"
    refs: list[tuple[ShardRef, bytes]] = []
    for i in range(OPEN_SHARDS * 2 + 5):
        writer = ShardWriter(directory, f"w0-{i:012x}")
        body = f'{{"n":{i}}}'.encode()
        outcome = Outcome(custom_id=f"c{i}", ok=True, status_code=200, body=msgspec.Raw(body))
        writer.store([outcome])
        writer.sync()
        writer.close()
        assert outcome.stored is not None
        refs.append((ShardRef(str(outcome.stored[0]), 0, len(body), []), body))
    before = len(os.listdir("/proc/self/fd"))
    with ShardReader(directory) as reader:
        for _ in range(2):
            for ref, body in [*refs, *reversed(refs)]:
                assert reader.load(ref) == (body, [])
                assert len(os.listdir("/proc/self/fd")) <= before + OPEN_SHARDS
    assert len(os.listdir("/proc/self/fd")) == before
