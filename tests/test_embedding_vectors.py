"""Embeddings journaled as float32 bytes (openai/vectors.py): the journal holds each vector as
base64, never as JSON float text; export writes each body as its request asked (floats exactly
the engine's float32 values, or OpenAI's base64), results.parquet float32; NaN and infinities
pass through the journal as they are and are written as null in a float list; a journal of JSON
float lists (an earlier version's) still resumes and exports; a kill -9 loses nothing and runs
nothing twice. On the echo engine (its vectors are known: engines/echo.py)."""

from __future__ import annotations

import base64
import json
import math
import struct
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from support.jobs import journal_records, rerun, submit_echo
from support.lines import write_jsonl
from support.vectors import (
    each_answered_once_bit_for_bit,
    embedding_line,
    embedding_lines,
    embeddings_job_killed_mid_run,
    export_all,
    f32,
    resume_recording,
    vector_of,
)

from batchrun.config import EngineSettings
from batchrun.engines.echo import (
    ECHO_MAX_DIMENSIONS,
    EchoEngine,
    echo_vector,
    echo_vector_bytes,
)
from batchrun.export.embeddings import as_requested, float_body
from batchrun.openai.records import EMBEDDINGS, Request
from batchrun.openai.vectors import float32_bytes


def test_the_journal_holds_float32_bytes_and_export_writes_what_each_request_asked(
    tmp_path: Path,
) -> None:
    refused = embedding_line("refused", "x", dimensions=ECHO_MAX_DIMENSIONS + 1)
    src = write_jsonl(
        tmp_path / "in.jsonl", [*embedding_lines(20), refused, *embedding_lines(40)[20:]]
    )
    job = tmp_path / "job"
    run = submit_echo(src, job)
    assert run.returncode == 1, run.stderr  # the refused line failed
    records = [r for r in journal_records(job) if r["kind"] == "result" and r["ok"]]
    assert len(records) == 40
    for rec in records:
        (item,) = rec["body"]["data"]
        # base64 float32 whatever was asked: never a float list in the journal.
        assert isinstance(item["embedding"], str)
        assert base64.b64decode(item["embedding"]) == echo_vector_bytes(
            f"passage {rec['custom_id'][1:]}", 1024
        )
        asked_floats = int(rec["custom_id"][1:]) % 2 == 0
        assert (rec["body"].get("export_encoding") == "float") is asked_floats
    per_result = (job / "journal.jsonl").stat().st_size / 40
    assert per_result <= 1.5 * 4 * 1024, per_result
    outputs, df = export_all(job)
    for i in range(40):
        out = outputs[f"e{i}"]
        body = out["response"]["body"]
        assert set(body) == {"object", "data", "model", "usage"}  # no export_encoding
        embedding = body["data"][0]["embedding"]
        assert isinstance(embedding, str if i % 2 else list)
        # Every value exactly the engine's float32, in either encoding.
        expected = echo_vector_bytes(f"passage {i}", 1024)
        assert vector_of(out) == expected
        if not i % 2:
            # The float64 of each float32 value: float32(parsed) is the value, bit for bit.
            assert embedding == echo_vector(f"passage {i}", 1024)
        assert df.loc[f"e{i}", "embeddings"][0].tobytes() == expected
    assert df.loc["refused", "embeddings"] is None and df.loc["refused", "status"] == "failed"
    schema = pq.read_schema(job / "results.parquet")
    assert str(schema.field("embeddings").type) == (
        "list<element: fixed_size_list<element: float>[1024]>"
    )


def test_nan_and_infinities_are_journaled_as_they_are_and_exported_as_null(
    tmp_path: Path,
) -> None:
    src = write_jsonl(
        tmp_path / "in.jsonl",
        [
            embedding_line("float", "x", dimensions=16),
            embedding_line("b64", "x", dimensions=16, encoding_format="base64"),
            embedding_line("many", ["x", "y"]),
            embedding_line("fine", "z", dimensions=16),
        ],
    )
    job = tmp_path / "job"
    run = submit_echo(src, job, env={"BATCHRUN_ECHO_NAN_ON": "float,b64,many"})
    assert run.returncode == 0, run.stderr
    nan_inf = f32([math.nan, math.inf, -math.inf])
    for rec in journal_records(job):
        if rec["kind"] == "result":
            raw = base64.b64decode(rec["body"]["data"][0]["embedding"])
            assert (raw[:12] == nan_inf) is (rec["custom_id"] != "fine")
    outputs, df = export_all(job)  # read strictly: no NaN or Infinity in output.jsonl
    rest = echo_vector("x", 16)[3:]
    assert outputs["float"]["response"]["body"]["data"][0]["embedding"] == [None] * 3 + rest
    assert vector_of(outputs["b64"]) == nan_inf + f32(rest)
    many = outputs["many"]["response"]["body"]["data"]
    assert [d["embedding"][:3] for d in many] == [[None] * 3] * 2
    assert outputs["fine"]["response"]["body"]["data"][0]["embedding"] == echo_vector("z", 16)
    # Parquet holds float32, NaN and infinities as they are.
    for cid in ("float", "b64"):
        first = df.loc[cid, "embeddings"][0][:3]
        assert math.isnan(first[0]) and list(first[1:]) == [math.inf, -math.inf]


def _old_format(rec: dict[str, Any]) -> str:
    """A result record as an earlier batchrun journaled it: a float request's vectors as JSON
    float lists (json's float text), no export_encoding key; a base64 request's as they were."""
    body = dict(rec["body"])
    if body.pop("export_encoding", None) == "float":
        body["data"] = [
            {**d, "embedding": echo_vector_bytes_floats(d["embedding"])} for d in body["data"]
        ]
    return json.dumps({**rec, "body": body}, separators=(",", ":"), ensure_ascii=False)


def echo_vector_bytes_floats(b64: str) -> list[float]:
    """A base64 float32 vector's values as floats."""
    raw = base64.b64decode(b64)
    return list(struct.unpack(f"<{len(raw) // 4}f", raw))


def test_a_journal_of_float_lists_from_an_earlier_version_resumes_and_exports(
    tmp_path: Path,
) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", embedding_lines(8, dimensions=64))
    job = tmp_path / "job"
    run = submit_echo(src, job)
    assert run.returncode == 0, run.stderr
    # The journal as an earlier version left it, killed after 4 results: e0-e3 in the old
    # format, e4-e7 never run; its summary gone (it is derived from the journal).
    records = [r for r in journal_records(job) if r["kind"] == "result"]
    kept = [r for r in records if r["custom_id"] in {"e0", "e1", "e2", "e3"}]
    old = [_old_format(r) for r in kept]
    assert '"embedding":[' in old[0] and "export_encoding" not in old[0]
    (job / "journal.jsonl").write_text("".join(x + "\n" for x in old), encoding="utf-8")
    for name in ("summary.json",):
        (job / name).unlink(missing_ok=True)
    record = tmp_path / "engine-record.txt"
    run = rerun("resume", job, env={"BATCHRUN_ECHO_RECORD": str(record)})
    assert run.returncode == 0, run.stderr
    assert sorted(record.read_text().split()) == ["e4", "e5", "e6", "e7"]
    outputs, df = export_all(job)
    assert sorted(outputs) == [f"e{i}" for i in range(8)]
    for i in range(8):
        expected = echo_vector_bytes(f"passage {i}", 64)
        assert vector_of(outputs[f"e{i}"]) == expected
        assert df.loc[f"e{i}", "embeddings"][0].tobytes() == expected
        embedding = outputs[f"e{i}"]["response"]["body"]["data"][0]["embedding"]
        assert isinstance(embedding, str if i % 2 else list)
    # An old record's body is written as it was journaled, byte for byte.
    old_body = json.loads(old[0])["body"]
    assert outputs["e0"]["response"]["body"] == old_body


def test_a_kill_9_mid_job_resumes_with_every_request_exactly_once(tmp_path: Path) -> None:
    n = 600
    job, done = embeddings_job_killed_mid_run(tmp_path, n)
    journal = job / "journal.jsonl"
    # A crash mid-write: half of one more record, no newline. Resume cuts it off.
    whole = journal.read_bytes()
    last = whole[whole.rstrip(b"\n").rfind(b"\n") + 1 :]
    with journal.open("ab") as f:
        f.write(last[: len(last) // 2])
    ran_again = resume_recording(tmp_path, job, whole)
    assert not set(ran_again) & done  # nothing journaled before the kill ran again
    each_answered_once_bit_for_bit(job, n)


def test_the_echo_engine_takes_dimensions_up_to_4096() -> None:
    engine = EchoEngine(EngineSettings(engine="echo"))

    def embed(dimensions: int) -> Any:
        body = {"input": ["a", "b"], "dimensions": dimensions}
        return engine._finish(Request("r", 1, EMBEDDINGS, body), 0.0)

    for size in (1, 8, 9, 1024, ECHO_MAX_DIMENSIONS):
        out = embed(size)
        assert out.ok, out.error
        a, b = (base64.b64decode(d["embedding"]) for d in out.body["data"])
        assert len(a) == len(b) == 4 * size and a != b
        values = struct.unpack(f"<{size}f", a)
        assert math.isclose(math.fsum(x * x for x in values), 1.0, rel_tol=1e-5)
        assert embed(size).body["data"] == out.body["data"]  # deterministic
    refused = embed(ECHO_MAX_DIMENSIONS + 1)
    assert not refused.ok and refused.status_code == 400
    assert refused.error == {
        "code": "invalid_request",
        "message": "body.dimensions must be between 1 and 4096 for the echo engine's "
        "embeddings, got 4097",
    }


def test_export_turns_a_marked_body_into_floats_and_leaves_the_rest() -> None:
    values = [0.1, -2.5, 1e-30, 3.4e38, math.nan]
    b64 = base64.b64encode(float32_bytes(values)).decode()
    item = {"object": "embedding", "index": 0, "embedding": b64}
    body = {"export_encoding": "float", "object": "list", "data": [item], "model": "m"}
    raw = json.dumps(body, separators=(",", ":")).encode()
    exported = float_body(raw)
    assert exported is not None
    floats = json.loads(exported)["data"][0]["embedding"]
    assert f32([x for x in floats if x is not None]) == float32_bytes(values[:4])
    assert floats[4] is None
    assert json.loads(exported) == as_requested(body)
    assert "export_encoding" not in json.loads(exported)
    # Not marked (a base64 request's, an old float list): written as it is.
    plain = {k: v for k, v in body.items() if k != "export_encoding"}
    assert float_body(json.dumps(plain).encode()) is None and as_requested(plain) == plain
    # Marked but not base64 (nothing batchrun writes): its items are left as they are.
    odd = {**body, "data": [{**item, "embedding": "not base64!"}]}
    assert as_requested(odd)["data"] == odd["data"]
