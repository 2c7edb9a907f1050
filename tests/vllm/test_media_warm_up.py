"""The worker's warm-up for a model that reads images (engines/vllm/media.py, warm_media_path):
run before the worker says it is ready, it is no line's: the job's answers and counts are its
lines' alone, and vLLM's prefix-cache counters hold only its lines' prompt tokens."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.cli import cli
from support.jobs import journal_records
from support.lines import write_jsonl
from support.mm_jobs import data_url, image_chat
from testmodels.multimodal import png_bytes

pytestmark = pytest.mark.vllm


def test_the_warm_up_is_no_lines(tmp_path: Path, tiny_mm_models: dict[str, Path]) -> None:
    lines = [
        image_chat(
            f"img-{i}",
            [
                {"type": "text", "text": f"Describe image {i}."},
                {
                    "type": "image_url",
                    "image_url": {
                        "url": data_url(png_bytes(40 + i, 30, (50 * i, 90, 128)), "image/png")
                    },
                },
            ],
            8,
        )
        for i in range(4)
    ]
    src = write_jsonl(tmp_path / "in.jsonl", lines)
    job = tmp_path / "job"
    run = cli(
        "submit", str(src), "--job-dir", str(job), "--model", str(tiny_mm_models["image"]),
        "--dtype", "float32", "--gpu-memory-utilization", "0.2", "--no-progress",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    records = journal_records(job)
    assert sorted(r["custom_id"] for r in records) == [f"img-{i}" for i in range(4)]
    assert all(r["ok"] for r in records)
    status = cli("status", "--job-dir", str(job), "--json")
    assert status.returncode == 0, status.stderr[-3000:]
    cache = json.loads(status.stdout)["prefix_cache"]
    # The warm-up's prompt (a chat with a small image) was looked up too, before the counters
    # were started again: what they hold is the lines' prompts, token for token.
    assert cache["queries"] == sum(r["prompt_tokens"] for r in records)
