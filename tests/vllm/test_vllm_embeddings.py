"""Embeddings on the real engine through a kill -9 (tests/support/vllm_pooling.py's kill job, on
all-MiniLM-L6-v2): every request journaled exactly once, its vectors journaled as float32 bytes,
and every value in output.jsonl and results.parquet raw vLLM's pooled float32, bit for bit."""

from __future__ import annotations

import base64
import struct
from collections import Counter
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.parquet as pq
import pytest
from support.jobs import journal_records
from support.vllm_pooling import KILL_EMBEDDINGS, run_embedding_kill_job

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def killed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return run_embedding_kill_job(tmp_path_factory.mktemp("vllm-embeddings-kill"))


def test_a_kill_9_resumes_with_every_request_journaled_exactly_once(killed: dict[str, Any]) -> None:
    n = len(KILL_EMBEDDINGS)
    assert 150 <= killed["killed_at"] < n, killed["killed_at"]  # killed mid-job
    resumed = killed["resume"]
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "Traceback" not in resumed.stderr
    records = [r for r in journal_records(killed["job"]) if r["kind"] == "result"]
    assert all(r["ok"] for r in records)
    counts = Counter(r["custom_id"] for r in records)
    assert set(counts) == {line["custom_id"] for line in KILL_EMBEDDINGS}
    assert set(counts.values()) == {1}  # nothing lost, nothing run twice
    for rec in records:  # float32 bytes (base64), never float text
        assert all(isinstance(d["embedding"], str) for d in rec["body"]["data"])
    assert killed["export"].returncode == 0, killed["export"].stderr
    assert len(killed["outputs"]) == n and not killed["errors"]


def test_every_value_is_vllms_pooled_float32_bit_for_bit(killed: dict[str, Any]) -> None:
    asked = {line["custom_id"]: line["body"].get("encoding_format") for line in KILL_EMBEDDINGS}
    for (cid, i, _), reference in zip(killed["items"], killed["raw"], strict=True):
        embedding = killed["outputs"][cid]["response"]["body"]["data"][i]["embedding"]
        if asked[cid] == "base64":
            got = base64.b64decode(embedding, validate=True)
        else:
            got = struct.pack(f"<{len(embedding)}f", *embedding)
            assert list(struct.unpack(f"<{len(embedding)}f", got)) == embedding
        assert len(got) == 4 * 384 and got == reference, (cid, i)


def test_results_parquet_holds_the_same_float32_values(killed: dict[str, Any]) -> None:
    assert killed["parquet"].returncode == 0, killed["parquet"].stderr
    path: Path = killed["job"] / "results.parquet"
    assert str(pq.read_schema(path).field("embeddings").type) == (
        "list<element: fixed_size_list<element: float>[384]>"
    )
    df = pd.read_parquet(path).set_index("custom_id")
    for (cid, i, _), reference in zip(killed["items"], killed["raw"], strict=True):
        assert df.loc[cid, "embeddings"][i].tobytes() == reference, (cid, i)
