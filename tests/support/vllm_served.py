"""The real-engine jobs that `batchrun serve` runs for the tests: several batches on a server,
whose engine stays loaded between them (the server's log says so; tests/vllm/test_serve_vllm.py
asserts it).

- The generative server (2 starts): the default model with a test-only thinking chat template
  and `--reasoning-parser qwen3`, `--batch-size 4`. Batch "completions" is the completions job
  (KILL_LINES k0-k31, lines 1-32; the e2e completions lines c0-c2, lines 33-35; then
  sample_data/completions_fidelity.jsonl, lines 36-44); batch "responses" the responses job
  (sample_data/responses.jsonl, then RESPONSES_REASONING); batch "again" the reasoning lines once
  more, under other custom_ids. The server (start 1) is killed with SIGKILL, its engine worker
  with it, in the middle of the completions batch; started again on the same root with `--ray
  local --workers 1` (start 2: one actor of a local Ray instance, which is also
  tests/test_ray.py's real engine in an actor), it finishes all three.
- The pooling server (1 start): all-MiniLM-L6-v2; batches "embeddings"
  (sample_data/embeddings.jsonl), "score" (sample_data/score.jsonl) and "rerank"
  (sample_data/rerank.jsonl), in that order, on one pooling engine.

Each batch comes back as the submit-made jobs of tests/support/vllm_jobs.py do (job, src, outputs,
errors, export, parquet: `batchrun export --job-dir` on the batch's job directory), plus the
`openai` client's last `Batch`, its output and error files read through the API (`files`) and
the server's log (both servers' logs, in order, for the generative one); `finished_with` checks
how either kind of job ended.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from openai.types import Batch

from support.lines import write_jsonl
from support.serving import Server, create_batch, lines_of, start_server, stop_server, wait_done
from support.vllm_jobs import (
    RESPONSES_REASONING,
    RESPONSES_SAMPLE,
    SAMPLES,
    completions_input,
    embedding_model_dir,
    exports,
    results,
    sample_lines,
    thinking_model,
)
from support.vllm_pooling import RERANK_SAMPLE, SCORE_SAMPLE
from support.waits import wait_until

EMBEDDINGS_SAMPLE = SAMPLES / "embeddings.jsonl"

# The reasoning lines again, in a second batch: the same greedy requests on the same engine.
AGAIN = [{**line, "custom_id": f"again-{line['custom_id']}"} for line in RESPONSES_REASONING]
# How long a served batch may take here (a loaded 2-core machine).
BATCH_TIMEOUT = 600


def _job(server: Server, batch: Batch, src: Path, log: str) -> dict[str, Any]:
    """A served batch, as the jobs of tests/support/vllm_jobs.py are (see the module's docstring)."""
    job = server.batch_dir(batch.id)
    return {"job": job, "src": src, "batch": batch, "log": log, **exports(job)}


def _await(
    server: Server, ids: dict[str, str]
) -> tuple[dict[str, Batch], dict[str, dict[str, list[dict[str, Any]]]]]:
    """Wait for each batch (name -> id) to end; its last Batch, and its output and error files
    read through the API."""
    client = server.client(api_key="unused")  # no --api-key: any key is accepted
    done: dict[str, Batch] = {}
    files: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for name, batch_id in ids.items():
        done[name] = batch = wait_done(client, batch_id, timeout=BATCH_TIMEOUT)
        files[name] = {
            "output": lines_of(client, batch.output_file_id) if batch.output_file_id else [],
            "error": lines_of(client, batch.error_file_id) if batch.error_file_id else [],
        }
    return done, files


def serve_batches(
    tmp: Path, server_args: list[str], batches: dict[str, tuple[Path, str]]
) -> dict[str, Any]:
    """Start one server, create `batches` (name -> (input, endpoint)) in order, wait for each to
    end, stop the server; each batch as a job (see the module's docstring), and the log."""
    # The server converts the default model first when this session has not (about 30 s).
    server = start_server(tmp / "root", *server_args, engine=None, timeout=300)
    try:
        client = server.client(api_key="unused")
        ids = {
            name: create_batch(client, src, endpoint=url).id for name, (src, url) in batches.items()
        }
        done, files = _await(server, ids)
    finally:
        stop_server(server)
    log = server.log.read_text(encoding="utf-8", errors="replace")
    jobs: dict[str, Any] = {"log": log}
    for name, batch in done.items():
        jobs[name] = {**_job(server, batch, batches[name][0], log), "files": files[name]}
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
    """The generative server, killed and started again on Ray (2 starts): the completions job,
    the responses job and the reasoning lines again, as three batches."""
    model = thinking_model(tmp)
    inputs = {
        "completions": (completions_input(tmp), "/v1/completions"),
        "responses": (
            write_jsonl(
                tmp / "responses.jsonl", [*sample_lines(RESPONSES_SAMPLE), *RESPONSES_REASONING]
            ),
            "/v1/responses",
        ),
        "again": (write_jsonl(tmp / "again.jsonl", AGAIN), "/v1/responses"),
    }
    args = [
        "--model", str(model), "--reasoning-parser", "qwen3", "--max-model-len", "1024",
        "--batch-size", "4",
    ]  # fmt: skip
    root = tmp / "root"
    first = start_server(root, *args, engine=None, timeout=300)
    try:
        client = first.client(api_key="unused")
        ids = {
            name: create_batch(client, src, endpoint=url).id for name, (src, url) in inputs.items()
        }
        # The completions batch runs first (it was created first), in file order (serve does not
        # reorder): kill -9 of the whole server, its engine worker with it, in its middle.
        completions = first.batch_dir(ids["completions"])
        wait_until(
            lambda: (completions / "journal.jsonl").exists() and len(results(completions)) >= 8,
            "8 completions results",
            timeout=400,
        )
        os.killpg(first.process.pid, signal.SIGKILL)
        first.process.wait(timeout=60)
        done_before = len(results(completions))
    finally:
        if first.process.poll() is None:
            stop_server(first, signal.SIGKILL)
    # Started again on the same root, in a local Ray instance (one actor): it finishes them all.
    second = start_server(root, *args, "--ray", "local", "--workers", "1", engine=None, timeout=300)
    try:
        done, files = _await(second, ids)
    finally:
        stop_server(second)
    logs = [s.log.read_text(encoding="utf-8", errors="replace") for s in (first, second)]
    served: dict[str, Any] = {"model": model, "logs": logs, "log": "\n".join(logs)}
    for name, batch in done.items():
        served[name] = {
            **_job(second, batch, inputs[name][0], served["log"]),
            "files": files[name],
            "model": model,
            "logs": logs,  # the first server's, then the second's
        }
    served["completions"]["done_before"] = done_before
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
