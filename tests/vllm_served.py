"""The real-engine jobs that `batchrun serve` runs for the tests: several batches on one server,
one engine start for all of them (the server's log says so; tests/test_serve_vllm.py asserts it).

- The generative server (1 start): the default model with a test-only thinking chat template and
  `--reasoning-parser qwen3`; batch "responses" is the responses job (sample_data/responses.jsonl,
  then RESPONSES_REASONING), batch "again" the reasoning lines once more, under other custom_ids.
- The pooling server (1 start): all-MiniLM-L6-v2; batches "embeddings"
  (sample_data/embeddings.jsonl), "score" (sample_data/score.jsonl) and "rerank"
  (sample_data/rerank.jsonl), in that order, on one pooling engine.

Each batch comes back as the submit-made jobs of tests/vllm_jobs.py do (job, src, outputs,
errors, export, parquet: `batchrun export --job-dir` on the batch's job directory), plus the
`openai` client's last `Batch` and the server's log; `finished_with` checks how either kind of
job ended.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from conftest import write_jsonl
from openai import OpenAI
from openai.types import Batch
from test_serve import lines_of, start_server, stop_server, wait_done
from vllm_jobs import (
    RESPONSES_REASONING,
    RESPONSES_SAMPLE,
    SAMPLES,
    _exports,
    embedding_model_dir,
    sample_lines,
    thinking_model,
)
from vllm_pooling import RERANK_SAMPLE, SCORE_SAMPLE

EMBEDDINGS_SAMPLE = SAMPLES / "embeddings.jsonl"

# The reasoning lines again, in a second batch: the same greedy requests on the same engine.
AGAIN = [{**line, "custom_id": f"again-{line['custom_id']}"} for line in RESPONSES_REASONING]
# How long a served batch may take here (a loaded 2-core machine).
BATCH_TIMEOUT = 600


def _create(client: OpenAI, src: Path, endpoint: str) -> Batch:
    with src.open("rb") as f:
        uploaded = client.files.create(file=f, purpose="batch")
    return client.batches.create(
        input_file_id=uploaded.id,
        endpoint=endpoint,  # type: ignore[arg-type]
        completion_window="24h",
    )


def serve_batches(
    tmp: Path, server_args: list[str], batches: dict[str, tuple[Path, str]]
) -> dict[str, Any]:
    """Start one server, create `batches` (name -> (input, endpoint)) in order, wait for each to
    end, stop the server; each batch as a job (see the module's docstring), and the log."""
    root = tmp / "root"
    # The server converts the default model first when this session has not (about 30 s).
    server = start_server(root, *server_args, engine=None, timeout=300)
    done: dict[str, Batch] = {}
    files: dict[str, dict[str, list[dict[str, Any]]]] = {}
    try:
        client = server.client(api_key="unused")  # no --api-key: any key is accepted
        created = {name: _create(client, src, url) for name, (src, url) in batches.items()}
        for name, batch in created.items():
            done[name] = wait_done(client, batch.id, timeout=BATCH_TIMEOUT)
            files[name] = {
                kind: lines_of(client, file_id) if file_id else []
                for kind, file_id in (
                    ("output", done[name].output_file_id),
                    ("error", done[name].error_file_id),
                )
            }
    finally:
        stop_server(server)
    log = server.log.read_text(encoding="utf-8", errors="replace")
    jobs: dict[str, Any] = {"log": log}
    for name, batch in done.items():
        job = server.batch_dir(batch.id)
        jobs[name] = {
            "job": job,
            "src": batches[name][0],
            "batch": batch,
            "log": log,
            "files": files[name],  # the output and error files, read through the API
            **_exports(job),
        }
    return jobs


def finished_with(job: dict[str, Any], failed: int) -> None:
    """The job ran to its end with exactly `failed` requests failed (the refused lines), whether
    `batchrun submit` ran it (exit 1 when any failed) or `batchrun serve` (a completed batch)."""
    if "batch" in job:
        batch: Batch = job["batch"]
        assert batch.status == "completed", (batch, job["log"][-3000:])
        assert batch.request_counts is not None and batch.request_counts.failed == failed, batch
        assert "Traceback" not in job["log"], job["log"][-3000:]
        return
    run = job["submit"]
    assert run.returncode == (1 if failed else 0), run.stderr[-3000:]
    assert "Traceback" not in run.stderr


def run_generative_server(tmp: Path) -> dict[str, Any]:
    """The generative server: the responses job and the reasoning lines again (1 start)."""
    model = thinking_model(tmp)
    src = write_jsonl(
        tmp / "responses.jsonl", [*sample_lines(RESPONSES_SAMPLE), *RESPONSES_REASONING]
    )
    again = write_jsonl(tmp / "again.jsonl", AGAIN)
    args = [
        "--model", str(model), "--reasoning-parser", "qwen3", "--max-model-len", "1024",
        "--batch-size", "16",
    ]  # fmt: skip
    served = serve_batches(
        tmp, args, {"responses": (src, "/v1/responses"), "again": (again, "/v1/responses")}
    )
    served["model"] = model
    served["responses"]["model"] = model
    return served


def run_pooling_server(tmp: Path) -> dict[str, Any]:
    """The pooling server: embeddings, score and rerank on all-MiniLM-L6-v2 (1 start)."""
    args = ["--model", str(embedding_model_dir()), "--batch-size", "32"]
    return serve_batches(
        tmp,
        args,
        {
            "embeddings": (EMBEDDINGS_SAMPLE, "/v1/embeddings"),
            "score": (SCORE_SAMPLE, "/v1/score"),
            "rerank": (RERANK_SAMPLE, "/v1/rerank"),
        },
    )

