"""Several base models in one real-vLLM job (2 engine starts): the packaged default model and the
tiny Idefics3, each line answered once by the model it names (the echo engine's several models:
tests/test_several_models.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.cli import cli
from support.jobs import answer_models, journal_records
from support.lines import model_line
from support.models import default_model_dir


@pytest.mark.vllm
def test_two_real_models_answer_their_own_lines_each_engine_started_once(
    tmp_path: Path, tiny_mm_models: dict[str, Path]
) -> None:
    """The packaged default model and the tiny Idefics3 in one job of text chat lines (2 engine
    starts): each line answered once, by the model it names."""
    text_model = default_model_dir()
    names = ["text", "image"] * 3
    lines = [model_line(f"r{i}", m) for i, m in enumerate(names)]
    for line in lines:
        line["body"]["temperature"] = 0
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    job = tmp_path / "job"
    r = cli(
        "submit", str(src), "--job-dir", str(job), "--no-progress",
        "--model", f"text={text_model}", "--model", f"image={tiny_mm_models['image']}",
        "--dtype", "float32", "--batch-size", "2", "--gpu-memory-utilization", "0.1",
        timeout=900,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert "switching to model image" in r.stderr
    # One worker, two engine starts: one header per start in its log.
    assert (job / "logs" / "worker-0.log").read_text().count("=== worker 0, pid") == 2
    ids = [x["custom_id"] for x in journal_records(job) if x["kind"] == "result"]
    assert sorted(ids) == sorted(f"r{i}" for i in range(6))
    assert answer_models(job) == {f"r{i}": m for i, m in enumerate(names)}
    status = json.loads(cli("status", "--job-dir", str(job), "--json").stdout)
    assert {n: (c["requests"], c["completed"]) for n, c in status["models"].items()} == {
        "text": (3, 3),
        "image": (3, 3),
    }
