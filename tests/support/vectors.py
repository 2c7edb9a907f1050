"""Embedding vectors as the tests write and read them: embeddings request lines, float32 bytes,
an output line's vector, a strict read of what export wrote."""

from __future__ import annotations

import base64
import json
import struct
from collections import Counter
from pathlib import Path
from typing import Any

import pandas as pd

from batchrun.engines.echo import echo_vector_bytes
from batchrun.openai.records import EMBEDDINGS
from support.cli import cli
from support.jobs import journal_records, rerun, start_echo
from support.lines import request_line, write_jsonl
from support.processes import kill_9_after


def embedding_line(cid: str, text: str, **body: Any) -> dict[str, Any]:
    """One /v1/embeddings request line."""
    return request_line(cid, EMBEDDINGS, {"model": "m", "input": text, **body})


def embedding_lines(n: int, dimensions: int = 1024) -> list[dict[str, Any]]:
    """`n` embeddings lines of `dimensions`, float (even) and base64 (odd) alternating."""
    return [
        embedding_line(
            f"e{i}",
            f"passage {i}",
            dimensions=dimensions,
            **({"encoding_format": "base64"} if i % 2 else {}),
        )
        for i in range(n)
    ]


def f32(values: list[float]) -> bytes:
    """Values as float32 bytes: equal bytes are equal float32 values, bit for bit (NaN too)."""
    return struct.pack(f"<{len(values)}f", *values)


def vector_of(out: dict[str, Any], index: int = 0) -> bytes:
    """An output line's embedding as float32 bytes, from its float list or its base64."""
    embedding = out["response"]["body"]["data"][index]["embedding"]
    if isinstance(embedding, str):
        return base64.b64decode(embedding, validate=True)
    return f32(embedding)


def strict_json(path: Path) -> list[dict[str, Any]]:
    """A JSONL file read strictly: NaN, Infinity and -Infinity are not JSON."""

    def refuse(name: str) -> None:
        raise AssertionError(f"{path.name} holds {name}, which is not JSON")

    return [json.loads(x, parse_constant=refuse) for x in path.read_text().splitlines()]


def export_all(job: Path) -> tuple[dict[str, dict[str, Any]], pd.DataFrame]:
    """Export output.jsonl and results.parquet; the output lines by custom_id, and the rows."""
    for args in ((), ("--parquet",)):
        run = cli("export", "--job-dir", str(job), *args)
        assert run.returncode == 0, run.stderr
    outputs = strict_json(job / "output.jsonl")
    by_id = {o["custom_id"]: o for o in outputs}
    assert len(by_id) == len(outputs)  # each request once
    return by_id, pd.read_parquet(job / "results.parquet").set_index("custom_id")


def embeddings_job_killed_mid_run(tmp_path: Path, n: int) -> tuple[Path, set[str]]:
    """An echo job of `n` embeddings lines (tmp_path/job) killed with SIGKILL after at least 100
    results and before its end; the job and the ids it finished."""
    src = write_jsonl(tmp_path / "in.jsonl", embedding_lines(n))
    job = tmp_path / "job"
    proc = start_echo(src, job, "--batch-size", "16", env={"BATCHRUN_ECHO_DELAY_MS": "20"})
    kill_9_after(proc, job, 100)
    done = {r["custom_id"] for r in journal_records(job) if r["kind"] == "result"}
    assert 100 <= len(done) < n
    return job, done


def resume_recording(tmp_path: Path, job: Path, whole: bytes) -> list[str]:
    """Resume a job of embeddings_job_killed_mid_run whose journal held `whole` before a torn
    tail was added: the resume succeeds and keeps `whole`. Returns the ids the engine ran."""
    record = tmp_path / "engine-record.txt"
    env = {"BATCHRUN_ECHO_DELAY_MS": "20", "BATCHRUN_ECHO_RECORD": str(record)}
    run = rerun("resume", job, env=env)
    assert run.returncode == 0, run.stderr
    assert (job / "journal.jsonl").read_bytes().startswith(whole)
    return record.read_text().split()


def each_answered_once_bit_for_bit(job: Path, n: int) -> None:
    """Every line of an embeddings_job_killed_mid_run job has one result in the journal, and
    export writes each line's echo vector exactly (output.jsonl and results.parquet)."""
    results = Counter(r["custom_id"] for r in journal_records(job) if r["kind"] == "result")
    assert set(results) == {f"e{i}" for i in range(n)} and set(results.values()) == {1}
    outputs, df = export_all(job)
    assert len(outputs) == n and len(df) == n
    for i in range(n):
        assert vector_of(outputs[f"e{i}"]) == echo_vector_bytes(f"passage {i}", 1024)
