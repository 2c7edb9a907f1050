"""`batchrun serve` driven by the `openai` package: files, the batch lifecycle, cancel, expiry,
priorities, auth and bad input, on one shared server running the echo engine."""

from __future__ import annotations

import concurrent.futures
import json
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai.types import Batch
from support import serving
from support.cli import cli
from support.jobs import journal_records, submit_echo
from support.lines import chat_line, read_jsonl, write_jsonl
from support.paths import ROOT
from support.ports import free_port
from support.waits import results_at_least, wait_until

from batchrun.serve.batches import RECORD_NAME, BatchRecord, BatchStore, new_batch

pytestmark = pytest.mark.slow  # out of the fast tier: docs/development.md


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[serving.Server]:
    """One server for this module, with an API key, a small upload cap and a slow echo engine."""
    root = tmp_path_factory.mktemp("serve") / "root"
    s = serving.start_server(
        root,
        "--api-key",
        serving.API_KEY,
        "--max-file-bytes",
        "1000000",
        *serving.SLOW_ENGINE,
        env=serving.SLOW_ENV,
    )
    yield s
    serving.stop_server(s)


def test_the_flow_of_the_issue_runs_and_status_agrees(
    server: serving.Server, tmp_path: Path
) -> None:
    """Upload, create, poll, download: every request answered once; invalid lines are failed
    requests with their line; `batchrun status` on the batch's job says what the API says."""
    client = server.client()
    path = serving.requests_file(tmp_path / "in.jsonl", 30)
    with path.open("a") as f:
        f.write("not json\n")
        f.write(
            json.dumps(
                {
                    "custom_id": "no-messages",
                    "method": "POST",
                    "url": "/v1/chat/completions",
                    "body": {"model": "m"},
                }
            )
            + "\n"
        )
    batch = serving.create_batch(client, path, metadata={"team": "a"})
    assert batch.status == "validating" and batch.metadata == {"team": "a"}
    done = serving.wait_done(client, batch.id)
    assert done.status == "completed"
    assert done.request_counts is not None
    assert (
        done.request_counts.total,
        done.request_counts.completed,
        done.request_counts.failed,
    ) == (32, 30, 2)
    assert done.usage is not None and done.usage.total_tokens > 0
    assert done.in_progress_at and done.finalizing_at and done.completed_at
    output = serving.lines_of(client, done.output_file_id)
    assert sorted(line["custom_id"] for line in output) == [f"req-{i:04d}" for i in range(30)]
    assert output[0]["response"]["body"]["choices"][0]["message"]["content"] == "hello 0"
    errors = serving.lines_of(client, done.error_file_id)
    assert [(e["custom_id"], e["error"]["line"]) for e in errors] == [
        (None, 31),
        ("no-messages", 32),
    ]
    status = subprocess.run(
        [
            sys.executable,
            "-m",
            "batchrun",
            "status",
            "--json",
            "--job-dir",
            str(server.batch_dir(batch.id)),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    )
    shown = json.loads(status.stdout)
    requests = shown["requests"]
    assert (requests["succeeded"], requests["invalid"], requests["pending"]) == (30, 2, 0)
    # The size the server's engines ran at (its --batch-size), and where they ran.
    assert (shown["batch_size"], shown["batch_size_source"]) == (4, "server")
    assert [w["worker"] for w in shown["workers"]] == [0]
    assert read_jsonl(server.batch_dir(batch.id) / "output.jsonl") == output
    ids = [b.id for b in client.batches.list(limit=100).data]
    assert batch.id in ids
    assert client.files.retrieve(done.output_file_id or "").purpose == "batch_output"


def test_a_batch_of_only_invalid_lines_fails_with_its_errors(
    server: serving.Server, tmp_path: Path
) -> None:
    """No valid line: failed, with errors.data naming each line and why; its job says so too
    (`batchrun status` reads the manifest: the batch's id, failed)."""
    client = server.client()
    path = write_jsonl(
        tmp_path / "bad.jsonl",
        [
            {
                "custom_id": "a",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": "m"},
            },
            {"custom_id": "a", "method": "GET", "url": "/v1/chat/completions", "body": {}},
        ],
    )
    done = serving.wait_done(client, serving.create_batch(client, path).id)
    assert done.status == "failed" and done.failed_at
    assert done.errors is not None and done.errors.data is not None
    assert [e.line for e in done.errors.data] == [1, 2]
    assert all(e.code and e.message for e in done.errors.data)
    manifest = json.loads((server.batch_dir(done.id) / "manifest.json").read_text())
    assert (manifest["job_id"], manifest["status"]) == (done.id, "failed")


def test_cancel_keeps_what_finished(server: serving.Server, tmp_path: Path) -> None:
    """cancelling, then cancelled: what finished is in the output file, nothing ran twice."""
    client = server.client()
    batch = serving.create_batch(client, serving.requests_file(tmp_path / "in.jsonl", 3000))
    job = server.batch_dir(batch.id)
    wait_until(results_at_least(job, 50), "50 requests of the batch finish")
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status == "cancelling" and cancelling.cancelling_at
    done = serving.wait_done(client, batch.id)
    assert done.status == "cancelled" and done.cancelled_at
    output = serving.lines_of(client, done.output_file_id)
    ids = [line["custom_id"] for line in output]
    assert 50 <= len(ids) < 3000 and len(set(ids)) == len(ids)
    assert done.request_counts is not None and done.request_counts.completed == len(ids)
    with pytest.raises(openai.BadRequestError):
        client.batches.cancel(batch.id)


def test_expiry_returns_finished_work_and_the_rest_as_batch_expired(
    server: serving.Server, tmp_path: Path
) -> None:
    """A window of 2s (the duration extension): expired, finished work in the output file,
    every other request a batch_expired error; each custom_id exactly once."""
    client = server.client()
    batch = serving.create_batch(
        client, serving.requests_file(tmp_path / "in.jsonl", 3000), window="2s"
    )
    assert batch.expires_at == batch.created_at + 2
    done = serving.wait_done(client, batch.id)
    assert done.status == "expired" and done.expired_at
    ok = [line["custom_id"] for line in serving.lines_of(client, done.output_file_id)]
    errors = serving.lines_of(client, done.error_file_id)
    assert {e["error"]["code"] for e in errors} == {"batch_expired"}
    assert 0 < len(ok) < 3000
    assert sorted(ok + [e["custom_id"] for e in errors]) == [f"req-{i:04d}" for i in range(3000)]
    assert done.request_counts is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (len(ok), len(errors))
    exported = cli("export", "--job-dir", str(server.batch_dir(batch.id)), "-o", str(tmp_path))
    assert exported.returncode == 0, exported.stderr
    assert read_jsonl(tmp_path / "errors.jsonl") == errors


def test_a_cancelled_batchs_job_exports_what_finished_and_never_runs_with_resume(
    server: serving.Server, tmp_path: Path
) -> None:
    """The job directory of a cancelled batch agrees with the API: `export` (no --partial)
    writes what finished, `status` names the batch and says cancelled, and `resume` and
    `retry-failed` refuse in one line, running nothing."""
    client = server.client()
    batch = serving.create_batch(client, serving.requests_file(tmp_path / "in.jsonl", 3000))
    job = server.batch_dir(batch.id)
    wait_until(results_at_least(job, 20), "20 requests of the batch finish")
    client.batches.cancel(batch.id)
    done = serving.wait_done(client, batch.id)
    assert done.status == "cancelled" and done.request_counts is not None
    finished = done.request_counts.completed + done.request_counts.failed
    assert finished < 3000
    exported = cli("export", "--job-dir", str(job), "-o", str(tmp_path / "out"))
    assert exported.returncode == 0, exported.stderr
    assert f"{3000 - finished:,} not run (the batch was cancelled)" in exported.stdout
    assert read_jsonl(tmp_path / "out" / "output.jsonl") == serving.lines_of(
        client, done.output_file_id
    )
    shown = json.loads(cli("status", "--json", "--job-dir", str(job)).stdout)
    assert (shown["job_id"], shown["status"]) == (batch.id, "cancelled")
    assert shown["requests"]["pending"] == 3000 - finished
    journal = (job / "journal.jsonl").read_bytes()
    for command in ("resume", "retry-failed"):
        refused = cli(command, "--job-dir", str(job))
        assert refused.returncode == 1
        assert refused.stderr.strip() == (
            f"error: this job is batch {batch.id} of `batchrun serve --root {server.root}`; "
            f"it runs there (the API's batch), not with {command}"
        )
    src = write_jsonl(tmp_path / "more.jsonl", [chat_line("x", "hi")])
    refused = submit_echo(src, job, progress=True)
    assert refused.returncode == 1 and "resume" not in refused.stderr, refused.stderr
    assert f"it runs on `batchrun serve --root {server.root}`" in refused.stderr
    assert (job / "journal.jsonl").read_bytes() == journal


def test_batches_of_one_priority_made_in_one_second_run_in_creation_order(
    server: serving.Server, tmp_path: Path
) -> None:
    """created_at is whole seconds: batches made within one second still run in the order they
    were made (not in the order of their random ids), behind a high-priority one that runs."""
    client = server.client()
    uploads = []
    for i in range(6):
        with serving.requests_file(tmp_path / f"n{i}.jsonl", 20, f"n{i}").open("rb") as f:
            uploads.append(client.files.create(file=f, purpose="batch").id)
    serving.create_batch(
        client, serving.requests_file(tmp_path / "h.jsonl", 300, "h"), metadata={"priority": "high"}
    )
    made = [
        client.batches.create(
            input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        for file_id in uploads
    ]
    assert len({b.created_at for b in made}) <= 2  # made within a second or two
    for b in made:
        assert serving.wait_done(client, b.id, timeout=60).status == "completed"

    def first_result(batch_id: str) -> float:
        return min(r["time"] for r in journal_records(server.batch_dir(batch_id)))

    starts = [first_result(b.id) for b in made]
    assert starts == sorted(starts), [b.id for b in made]


def test_the_creation_order_is_kept_across_a_restart_and_old_records_load(
    tmp_path: Path,
) -> None:
    """The store numbers batches as they are made and keeps the number in batch.json; a record
    written before it was kept loads, ordered by its creation second and then its id."""

    def batch(c: str, created_at: int) -> dict[str, Any]:
        made = new_batch(f"batch_{c * 24}", "file-" + "0" * 24, "/v1/chat/completions",
                         "24h", 86400, None, "m")  # fmt: skip
        return {**made, "created_at": created_at}

    old = [batch(c, 100) for c in "ba"]  # written before the sequence: no "seq" key
    for b in old:
        (tmp_path / "batches" / b["id"]).mkdir(parents=True)
        (tmp_path / "batches" / b["id"] / RECORD_NAME).write_text(
            json.dumps({"batch": b, "priority": "normal", "final": None})
        )
    store = BatchStore(tmp_path)
    made = [batch(c, 200) for c in "fedc"]  # ids against the order they are made in
    for b in made:
        store.add(BatchRecord(b))
    again = BatchStore(tmp_path)
    expected = [b["id"] for b in (*reversed(old), *made)]
    assert [r.id for r in sorted(again.all(), key=BatchRecord.queue_order)] == expected
    assert [r.id for r in again.all()] == expected[::-1]  # the API lists the newest first
    later = BatchRecord(batch("9", 200))
    again.add(later)
    assert later.seq == 5


def test_priority_high_runs_before_normal_before_low(
    server: serving.Server, tmp_path: Path
) -> None:
    """While a normal batch runs, a low then a high one arrive: high runs first, low last."""
    client = server.client()
    normal = serving.create_batch(client, serving.requests_file(tmp_path / "n.jsonl", 600, "n"))
    job = server.batch_dir(normal.id)
    wait_until(results_at_least(job, 20), "the normal batch runs")
    low = serving.create_batch(
        client, serving.requests_file(tmp_path / "l.jsonl", 100, "l"), metadata={"priority": "low"}
    )
    high = serving.create_batch(
        client, serving.requests_file(tmp_path / "h.jsonl", 100, "h"), metadata={"priority": "high"}
    )
    for b in (normal, low, high):
        assert serving.wait_done(client, b.id, timeout=60).status == "completed"

    def span(batch_id: str) -> tuple[float, float]:
        times = [
            r["time"] for r in journal_records(server.batch_dir(batch_id)) if r["kind"] == "result"
        ]
        return min(times), max(times)

    assert span(high.id)[1] < span(normal.id)[1] < span(low.id)[1]
    assert span(high.id)[1] <= span(low.id)[0]


def test_auth_needs_the_key_everywhere_but_health(server: serving.Server) -> None:
    """401 in OpenAI's shape without the right key; /health needs none."""
    with pytest.raises(openai.AuthenticationError) as e:
        server.client("wrong").files.list()
    assert e.value.body == {
        "message": e.value.body["message"],
        "type": "invalid_request_error",  # type: ignore[index]
        "param": None,
        "code": "invalid_api_key",
    }
    for path in ("/v1/batches", "/metrics", "/v1/files/file-000000000000000000000000"):
        assert httpx.get(server.url + path).status_code == 401
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}
    metrics = httpx.get(
        server.url + "/metrics", headers={"Authorization": f"Bearer {serving.API_KEY}"}
    )
    assert 'batchrun_requests_total{outcome="succeeded"}' in metrics.text
    assert 'batchrun_engine_restarts_total{reason="crash"} 0.0' in metrics.text


def test_ids_that_are_not_ours_are_404_and_reach_no_path(server: serving.Server) -> None:
    """Traversal, unknown and encoded ids: 404 in OpenAI's shape."""
    headers = {"Authorization": f"Bearer {serving.API_KEY}"}
    for path in (
        "/v1/files/..%2F..%2Fserver.lock/content",
        "/v1/files/..%2Fbatches",
        "/v1/files/file-%2e%2e",
        "/v1/files/file-ffffffffffffffffffffffff/content",
        "/v1/batches/batch_%2e%2e%2f",
        "/v1/batches/batch_ffffffffffffffffffffffff",
        "/v1/batches/..%2F..%2Fetc/cancel",
    ):
        method = "POST" if path.endswith("/cancel") else "GET"
        answer = httpx.request(method, server.url + path, headers=headers)
        assert answer.status_code == 404, path
        assert answer.json()["error"]["code"] == "not_found", path
    with pytest.raises(openai.NotFoundError):
        server.client().files.delete("file-ffffffffffffffffffffffff")


def test_bad_input_is_400_and_a_big_upload_413(server: serving.Server, tmp_path: Path) -> None:
    """Wrong purpose, wrong endpoint, bad window: 400; an input file that does not exist: 404;
    over the cap: 413, nothing kept (a declared size, or a chunked body that runs over)."""
    client = server.client()
    small = serving.requests_file(tmp_path / "small.jsonl", 2)
    with pytest.raises(openai.BadRequestError, match="purpose"):
        client.files.create(file=small.open("rb"), purpose="fine-tune")
    with pytest.raises(openai.NotFoundError, match=r"No such file: 'file-f+' \(input_file_id\)"):
        client.batches.create(
            input_file_id="file-ffffffffffffffffffffffff",
            endpoint="/v1/chat/completions",
            completion_window="24h",
        )
    uploaded = client.files.create(file=small.open("rb"), purpose="batch")
    with pytest.raises(openai.BadRequestError, match="not the batch's endpoint"):
        client.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/completions", completion_window="24h"
        )
    with pytest.raises(openai.BadRequestError, match="completion_window"):
        client.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="soon"
        )  # type: ignore[arg-type]
    before = {f.id for f in client.files.list()}
    big = tmp_path / "big.jsonl"
    big.write_bytes(b"x" * 1_500_000)
    with pytest.raises(openai.APIStatusError) as e:
        client.files.create(file=big.open("rb"), purpose="batch")
    assert e.value.status_code == 413

    def chunks() -> Iterator[bytes]:
        yield b'--b\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        yield b'--b\r\nContent-Disposition: form-data; name="file"; filename="x.jsonl"\r\n\r\n'
        for _ in range(150):
            yield b"y" * 10_000

    answer = httpx.post(
        server.url + "/v1/files",
        content=chunks(),
        headers={
            "Authorization": f"Bearer {serving.API_KEY}",
            "Content-Type": "multipart/form-data; boundary=b",
        },
    )
    assert answer.status_code == 413
    assert answer.json()["error"]["code"] == "file_too_large"
    assert {f.id for f in client.files.list()} == before
    assert not list((server.root / "files").glob(".upload-*"))


def test_an_input_that_is_not_jsonl_fails_naming_its_file_id_not_a_path(
    server: serving.Server, tmp_path: Path
) -> None:
    """A batch of an upload that is not JSONL fails; errors.data names the input by its file
    id, never by a path of the server's (its root, its copy of the input)."""
    client = server.client()
    path = tmp_path / "in.jsonl"
    path.write_bytes(random.Random(0).randbytes(4096))
    batch = serving.create_batch(client, path)
    done = serving.wait_done(client, batch.id)
    assert done.status == "failed"
    assert done.errors is not None and done.errors.data is not None
    [error] = done.errors.data
    assert error.code == "invalid_input"
    assert error.message is not None and error.message.startswith(
        f"{batch.input_file_id} is not a JSONL file of requests (line 1: "
    )
    root = str(server.root)
    for leak in (root, str(server.root.resolve()), server.root.name + "/", "input.jsonl"):
        assert leak not in error.message


def test_an_input_holding_one_json_array_fails_as_not_jsonl(
    server: serving.Server, tmp_path: Path
) -> None:
    """Refused as the CLI refuses it, not run as a batch of one invalid line."""
    client = server.client()
    path = tmp_path / "in.json"
    path.write_text(json.dumps([chat_line("a", "hi"), chat_line("b", "ho")], indent=2))
    batch = serving.create_batch(client, path)
    done = serving.wait_done(client, batch.id)
    assert done.status == "failed"
    assert done.errors is not None and done.errors.data is not None
    [error] = done.errors.data
    assert (error.code, error.message) == (
        "invalid_input",
        f"{batch.input_file_id} holds a JSON array, not JSONL (one request object a line)",
    )


def test_a_completion_window_beyond_a_year_is_refused(
    server: serving.Server, tmp_path: Path
) -> None:
    """Durations are an extension (OpenAI takes only 24h), up to 365 days: beyond, OpenAI's 400."""
    client = server.client()
    path = serving.requests_file(tmp_path / "in.jsonl", 1)
    for window in ("99999999d", "366d", "8761h"):
        with pytest.raises(openai.BadRequestError) as e:
            serving.create_batch(client, path, window=window)
        assert e.value.body == {
            "message": f"completion_window must be at most 365d (31536000 seconds), got '{window}'",
            "type": "invalid_request_error",
            "param": "completion_window",
            "code": None,
        }
    longest = serving.create_batch(client, path, window="365d")
    assert longest.expires_at == longest.created_at + 365 * 86400
    serving.wait_done(client, longest.id)


def test_a_body_that_is_not_json_is_an_openai_400(server: serving.Server) -> None:
    """A body that is not JSON, or not an object, is OpenAI's 400 with param null; a bad field
    names its path as param (no "body", no loc index)."""
    headers = {"Authorization": f"Bearer {serving.API_KEY}"}

    def post(content: bytes, content_type: str = "application/json") -> httpx.Response:
        return httpx.post(
            server.url + "/v1/batches",
            content=content,
            headers={**headers, "Content-Type": content_type},
        )

    def error(message: str, param: str | None = None) -> dict[str, Any]:
        return {
            "error": {
                "message": message,
                "type": "invalid_request_error",
                "param": param,
                "code": None,
            }
        }

    answer = post(b"not json")
    assert answer.status_code == 400
    assert answer.json() == error(
        "The request body is not valid JSON: Expecting value at character 0"
    )
    assert post(b'{"endpoint": ').json() == error(
        "The request body is not valid JSON: Expecting value at character 13"
    )
    assert post(b"").json() == error("The request body is missing: send a JSON object")
    assert post(b"[1, 2]").json()["error"]["param"] is None
    assert post(b'{"a": 1}', "text/plain").json() == error(
        "The request body must be a JSON object sent as application/json"
    )
    fields = {
        "input_file_id": "file-ffffffffffffffffffffffff",
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
        "metadata": {"priority": 1},
    }
    answer = post(json.dumps(fields).encode())
    assert answer.status_code == 400
    assert answer.json() == error(
        "metadata.priority: Input should be a valid string", "metadata.priority"
    )
    answer = httpx.get(server.url + "/v1/batches", params={"limit": 0}, headers=headers)
    assert answer.status_code == 400
    assert answer.json() == error("limit: Input should be greater than or equal to 1", "limit")


def test_fifty_clients_at_once_lose_nothing(server: serving.Server, tmp_path: Path) -> None:
    """50 clients upload, create and poll at the same time: no error, every file listed."""

    def one(i: int) -> tuple[str, Batch]:
        client = server.client()
        path = serving.requests_file(tmp_path / f"c{i}.jsonl", 3, f"c{i}")
        batch = serving.create_batch(client, path)
        return batch.input_file_id, serving.wait_done(client, batch.id, timeout=60)

    with concurrent.futures.ThreadPoolExecutor(50) as pool:
        results = list(pool.map(one, range(50)))
    listed = {f.id for f in server.client().files.list()}
    assert all(file_id in listed for file_id, _ in results)
    assert all(b.status == "completed" for _, b in results)
    assert all(b.request_counts is not None and b.request_counts.completed == 3 for _, b in results)


def test_a_second_server_on_the_same_root_is_refused(server: serving.Server) -> None:
    """One line, exit 1: two servers would run the same batches twice."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "batchrun",
            "serve",
            "--root",
            str(server.root),
            "--engine",
            "echo",
            "--port",
            str(free_port()),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=30,
    )
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"error: another batchrun serve already runs on {server.root}; stop it first, or "
        "choose another --root"
    )
    assert "Traceback" not in result.stderr


def test_a_port_in_use_is_one_line_and_nothing_runs(server: serving.Server, tmp_path: Path) -> None:
    """The socket is bound before the banner and before any batch of the root resumes."""
    port = server.url.rsplit(":", 1)[1]
    other = tmp_path / "other-root"
    result = subprocess.run(
        [sys.executable, "-m", "batchrun", "serve", "--root", str(other), "--engine", "echo",
         "--port", port],
        capture_output=True, text=True, cwd=ROOT, timeout=30,
    )  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"error: cannot listen on 127.0.0.1:{port}: Address already in use; choose another --port"
    )
    assert not other.exists()  # the root it made is taken away with it


def test_a_stopped_server_says_how_to_go_on(tmp_path: Path) -> None:
    root = tmp_path / "root"
    s = serving.start_server(root)
    serving.stop_server(s)
    assert s.process.returncode == 143
    assert s.log.read_text().splitlines()[-1] == (
        f"terminated: the journal is flushed; nothing finished is lost. Continue with: "
        f"batchrun serve --root {root}"
    )


def test_a_batch_runs_in_the_dispatch_plans_order(tmp_path: Path) -> None:
    """Questions over two documents, interleaved in the file: the server sends them in the plan's
    order (grouped by document, each group's first one early: run/planner.py), as submit does."""
    from batchrun.openai.records import Request
    from batchrun.run.planner import order_window

    doc = {d: f"Document {d}. " + "A long shared text. " * 20 for d in "AB"}
    lines = [
        chat_line(f"{d}{q}", doc[d] + f"Question {q}?", max_tokens=4, temperature=0)
        for q in range(3)
        for d in "AB"
    ]
    planned = order_window(
        [Request(x["custom_id"], i + 1, x["url"], x["body"]) for i, x in enumerate(lines)]
    )
    expected = [r.custom_id for r in planned]
    assert expected != [x["custom_id"] for x in lines]  # the plan moves them
    root = tmp_path / "root"
    # One request at a time: the journal's order is the order of dispatch.
    server = serving.start_server(root, "--batch-size", "1", env=serving.SLOW_ENV)
    try:
        client = server.client(api_key="unused")
        batch = serving.create_batch(client, write_jsonl(tmp_path / "in.jsonl", lines))
        assert serving.wait_done(client, batch.id).status == "completed"
    finally:
        serving.stop_server(server)
    done = [r["custom_id"] for r in journal_records(server.batch_dir(batch.id))]
    assert done == expected


def test_identical_deterministic_lines_run_once_and_each_gets_its_answer(
    server: serving.Server, tmp_path: Path
) -> None:
    """Greedy duplicates are sent to the engine once; every custom_id still gets its own answer
    (its own response id) in the output file; sampled duplicates each run."""
    client = server.client()
    lines = [
        *(chat_line(f"same-{i}", "the same question", temperature=0) for i in range(5)),
        *(chat_line(f"sampled-{i}", "a sampled question", temperature=1.0) for i in range(3)),
    ]
    batch = serving.create_batch(client, write_jsonl(tmp_path / "dups.jsonl", lines))
    done = serving.wait_done(client, batch.id)
    assert done.status == "completed" and done.request_counts is not None
    assert done.request_counts.completed == 8
    output = {line["custom_id"]: line for line in serving.lines_of(client, done.output_file_id)}
    assert sorted(output) == sorted(x["custom_id"] for x in lines)
    assert len({line["response"]["body"]["id"] for line in output.values()}) == 8
    records = journal_records(server.batch_dir(batch.id))
    copies = {r["custom_id"]: r["copy_of"] for r in records if "copy_of" in r}
    assert copies == {f"same-{i}": "same-0" for i in range(1, 5)}
    status = subprocess.run(
        [sys.executable, "-m", "batchrun", "status", "--json", "--job-dir",
         str(server.batch_dir(batch.id))],
        capture_output=True, text=True, cwd=ROOT, check=True,
    )  # fmt: skip
    assert json.loads(status.stdout)["deduplicated"] == 4


def test_output_expires_after_deletes_the_output_files_when_due(
    server: serving.Server, tmp_path: Path
) -> None:
    """output_expires_after: the output and error files expire that many seconds after they are
    made (any number from 1: shorter than OpenAI's hour, an extension), then are gone."""
    client = server.client()
    path = serving.requests_file(tmp_path / "in.jsonl", 3)
    with path.open("a") as f:
        f.write("not json\n")  # an error file too
    batch = serving.create_batch(
        client, path, output_expires_after={"anchor": "created_at", "seconds": 2}
    )
    done = serving.wait_done(client, batch.id)
    assert done.output_file_id and done.error_file_id
    for file_id in (done.output_file_id, done.error_file_id):
        made = client.files.retrieve(file_id)
        assert made.expires_at == made.created_at + 2
        assert client.files.content(file_id).text
    wait_until(
        lambda: done.output_file_id not in {f.id for f in client.files.list()},
        "the output file expires",
        timeout=10,
    )
    for file_id in (done.output_file_id, done.error_file_id):
        with pytest.raises(openai.NotFoundError):
            client.files.retrieve(file_id)
        with pytest.raises(openai.NotFoundError):
            client.files.content(file_id)
    assert client.files.retrieve(batch.input_file_id).expires_at is None  # inputs stay


@pytest.mark.parametrize(
    ("expires", "param", "message"),
    [
        (
            {"anchor": "completed_at", "seconds": 60},
            "output_expires_after.anchor",
            "output_expires_after.anchor must be 'created_at', got 'completed_at'",
        ),
        (
            {"anchor": "created_at", "seconds": 0},
            "output_expires_after.seconds",
            "output_expires_after.seconds must be an integer from 1 to 2592000, got 0",
        ),
        (
            {"anchor": "created_at"},
            "output_expires_after",
            "output_expires_after takes anchor and seconds only, got no seconds",
        ),
    ],
)
def test_a_bad_output_expires_after_is_refused(
    server: serving.Server, tmp_path: Path, expires: dict[str, Any], param: str, message: str
) -> None:
    client = server.client()
    with pytest.raises(openai.BadRequestError) as e:
        serving.create_batch(
            client, serving.requests_file(tmp_path / "in.jsonl", 1), output_expires_after=expires
        )
    assert e.value.body == {
        "message": message,
        "type": "invalid_request_error",
        "param": param,
        "code": None,
    }
