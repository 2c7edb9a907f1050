"""A poison line under `batchrun serve`: the request that kills its engine worker whenever it runs
(BATCHRUN_ECHO_CRASH_ON, named by its custom_id as under submit) fails alone; the rest of its
batch completes (echo engine)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import serving
from support.lines import chat_line, write_jsonl

pytestmark = pytest.mark.slow  # out of the fast tier: docs/development.md


def test_a_poison_line_under_serve_fails_alone(tmp_path: Path) -> None:
    """50 lines, one poison: 49 completed, 1 failed (engine_crash, in the error file)."""
    env = {"BATCHRUN_ECHO_CRASH_ON": "r-0017", "BATCHRUN_ECHO_DELAY_MS": "5"}
    server = serving.start_server(tmp_path / "root", "--api-key", serving.API_KEY, env=env)
    try:
        client = server.client()
        path = write_jsonl(
            tmp_path / "in.jsonl", [chat_line(f"r-{i:04d}", f"hello {i}") for i in range(50)]
        )
        batch = serving.wait_done(client, serving.create_batch(client, path).id, timeout=120)
        assert batch.status == "completed"
        assert batch.request_counts is not None
        counts = batch.request_counts
        assert (counts.total, counts.completed, counts.failed) == (50, 49, 1)
        errors = serving.lines_of(client, batch.error_file_id)
        assert [e["custom_id"] for e in errors] == ["r-0017"]
        assert errors[0]["error"]["code"] == "engine_crash"
        output = serving.lines_of(client, batch.output_file_id)
        assert sorted(o["custom_id"] for o in output) == [
            f"r-{i:04d}" for i in range(50) if i != 17
        ]
    finally:
        serving.stop_server(server)
