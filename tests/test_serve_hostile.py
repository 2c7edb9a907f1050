"""`batchrun serve` under hostile or careless input: the key checked before any body is read,
bodies capped, JSON that nests without bound, uploads cut short, unknown fields, list order,
file expiry, empty inputs, and /metrics agreeing with the batches (echo engine)."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import openai
import pytest
from support import serving
from support.lines import chat_line, write_jsonl
from support.waits import wait_until

from batchrun.serve.guard import MAX_BODY_BYTES, MAX_DEPTH

pytestmark = pytest.mark.slow  # out of the fast tier: docs/development.md

AUTH = {"Authorization": f"Bearer {serving.API_KEY}"}
BAD_KEY = {
    "error": {
        "message": "Incorrect API key provided. Pass it as 'Authorization: Bearer KEY'.",
        "type": "invalid_request_error",
        "param": None,
        "code": "invalid_api_key",
    }
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[serving.Server]:
    """One server with an API key, on the echo engine."""
    root = tmp_path_factory.mktemp("hostile") / "root"
    s = serving.start_server(root, "--api-key", serving.API_KEY, "--max-file-bytes", "1000000")
    yield s
    serving.stop_server(s)


def raw_exchange(server: serving.Server, head: bytes, body: bytes, timeout: float = 5) -> bytes:
    """Send a request's head and part of its body on a socket; what the server answers."""
    where = urlsplit(server.url)
    with socket.create_connection((where.hostname, where.port), timeout=timeout) as s:
        s.sendall(head + body)
        answer = b""
        try:
            while b"\r\n\r\n" not in answer or not _whole(answer):
                chunk = s.recv(65536)
                if not chunk:
                    break
                answer += chunk
        except TimeoutError:
            pass
        return answer


def _whole(answer: bytes) -> bool:
    head, _, body = answer.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(body) >= int(line.split(b":")[1])
    return False


def status_and_json(answer: bytes) -> tuple[int, Any]:
    """The status code and JSON body of a raw HTTP answer."""
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head, "no answer"
    return int(head.split(b" ")[1]), json.loads(body)


def test_no_key_is_401_before_a_byte_of_a_huge_body_is_read(server: serving.Server) -> None:
    """A 150 MB POST without a key is answered 401 at once (declared or chunked), the server
    never reading it; malformed JSON without a key is 401 too, not 400."""
    pid = server.process.pid
    before = _rss_kb(pid)
    head = (
        b"POST /v1/batches HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 150000000\r\n\r\n"
    )
    started = time.monotonic()
    answer = raw_exchange(server, head, b"[" * 65536, timeout=3)
    assert status_and_json(answer) == (401, BAD_KEY)
    assert time.monotonic() - started < 2.5
    chunked = (
        b"POST /v1/batches HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )
    answer = raw_exchange(server, chunked, b"10000\r\n" + b"{" * 65536 + b"\r\n", timeout=3)
    assert status_and_json(answer) == (401, BAD_KEY)
    bad = httpx.post(
        server.url + "/v1/batches", content=b'{"endpoint": ', headers={"Authorization": "Bearer x"}
    )
    assert (bad.status_code, bad.json()) == (401, BAD_KEY)
    upload = httpx.post(server.url + "/v1/files", files={"file": b"x"}, data={"purpose": "batch"})
    assert (upload.status_code, upload.json()) == (401, BAD_KEY)
    assert _rss_kb(pid) - before < 50_000


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_a_body_past_the_cap_is_413_declared_or_streamed(server: serving.Server) -> None:
    """With the key: a JSON body over MAX_BODY_BYTES is refused without being buffered whole."""
    head = (
        b"POST /v1/batches HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {serving.API_KEY}\r\nContent-Length: {MAX_BODY_BYTES + 1}\r\n\r\n".encode()
    )
    code, body = status_and_json(raw_exchange(server, head, b"{"))
    assert (code, body["error"]["code"]) == (413, "request_too_large")

    def chunks() -> Iterator[bytes]:
        for _ in range(MAX_BODY_BYTES // 65536 + 2):
            yield b" " * 65536

    answer = httpx.post(server.url + "/v1/batches", content=chunks(), headers=AUTH)
    assert answer.status_code == 413


def test_json_nested_without_bound_is_a_clear_400_never_a_500(
    server: serving.Server, tmp_path: Path
) -> None:
    """A body nesting 5,000 deep: 400 saying so. An input whose first line nests 5,000 deep
    (before any line naming a url): the batch is made, that line invalid, the rest run."""
    deep = b'{"metadata": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    answer = httpx.post(
        server.url + "/v1/batches",
        content=deep,
        headers={**AUTH, "Content-Type": "application/json"},
    )
    assert answer.status_code == 400
    assert answer.json()["error"]["message"] == (
        f"The request body nests deeper than {MAX_DEPTH} levels"
    )
    path = tmp_path / "deep.jsonl"
    lines: list[Any] = ['{"x": ' + "[" * 5000 + "]" * 5000 + "}"]
    lines += [chat_line(f"r{i}", f"hi {i}") for i in range(3)]
    write_jsonl(path, lines)
    client = server.client()
    batch = serving.wait_done(client, serving.create_batch(client, path).id)
    assert batch.status == "completed"
    assert batch.request_counts is not None
    assert (batch.request_counts.completed, batch.request_counts.failed) == (3, 1)


def test_an_upload_cut_short_is_refused_and_nothing_is_stored(server: serving.Server) -> None:
    """A multipart body without its closing boundary is 400; no file is listed or left."""
    files_dir = server.root / "files"
    listed = server.client().files.list().data
    stored = sorted(p.name for p in files_dir.iterdir())
    body = (
        b'--XyZ\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        b'--XyZ\r\nContent-Disposition: form-data; name="file"; filename="a.jsonl"\r\n'
        b"Content-Type: application/octet-stream\r\n\r\n"
        + json.dumps(chat_line("a", "cut")).encode()
        + b"\n"
    )
    answer = httpx.post(
        server.url + "/v1/files",
        content=body,
        headers={**AUTH, "Content-Type": "multipart/form-data; boundary=XyZ"},
    )
    assert answer.status_code == 400
    assert answer.json()["error"]["message"] == (
        "the upload was cut short: its closing multipart boundary is missing"
    )
    assert server.client().files.list().data == listed
    assert sorted(p.name for p in files_dir.iterdir()) == stored


def test_an_upload_shorter_than_its_content_length_leaves_nothing(server: serving.Server) -> None:
    """A whole multipart body, but fewer bytes than declared, the client then gone: nothing is
    listed or left on disk."""
    files_dir = server.root / "files"
    listed = server.client().files.list().data
    stored = sorted(p.name for p in files_dir.iterdir())
    body = (
        b'--XyZ\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        b'--XyZ\r\nContent-Disposition: form-data; name="file"; filename="a.jsonl"\r\n\r\n'
        + json.dumps(chat_line("a", "short")).encode()
        + b"\n\r\n--XyZ--\r\n"
    )
    head = (
        b"POST /v1/files HTTP/1.1\r\nHost: x\r\n"
        + f"Authorization: Bearer {serving.API_KEY}\r\n".encode()
        + b"Content-Type: multipart/form-data; boundary=XyZ\r\n"
        + f"Content-Length: {len(body) + 1000}\r\n\r\n".encode()
    )
    where = urlsplit(server.url)
    with socket.create_connection((where.hostname, where.port), timeout=5) as s:
        s.sendall(head + body)
        time.sleep(0.3)
        s.shutdown(socket.SHUT_WR)
        s.settimeout(2)
        with contextlib.suppress(TimeoutError, ConnectionError):
            s.recv(65536)
    time.sleep(0.3)
    assert server.client().files.list().data == listed
    assert sorted(p.name for p in files_dir.iterdir()) == stored


def test_unknown_fields_on_a_batch_are_refused_naming_the_field(
    server: serving.Server, tmp_path: Path
) -> None:
    """`bogus_field` and a misspelt `completion_windw`: OpenAI's 400, the field as param."""
    client = server.client()
    path = write_jsonl(tmp_path / "in.jsonl", [chat_line("a", "x")])
    with path.open("rb") as f:
        file_id = client.files.create(file=f, purpose="batch").id
    fields = {"input_file_id": file_id, "endpoint": "/v1/chat/completions"}
    for extra in ({"completion_window": "24h", "bogus_field": 1}, {"completion_windw": "24h"}):
        answer = httpx.post(server.url + "/v1/batches", json={**fields, **extra}, headers=AUTH)
        name = next(k for k in extra if k != "completion_window")
        assert answer.status_code == 400
        assert answer.json()["error"] == {
            "message": f"Unrecognized request argument supplied: {name}",
            "type": "invalid_request_error",
            "param": name,
            "code": None,
        }


def test_lists_are_newest_first_stable_and_take_order_and_after(
    server: serving.Server, tmp_path: Path
) -> None:
    """Files and batches made in the same second list in creation order (desc by default),
    order=asc reverses it, after pages through it."""
    client = server.client()
    path = write_jsonl(tmp_path / "in.jsonl", [chat_line("a", "x")])
    made = []
    for _ in range(12):
        with path.open("rb") as f:
            made.append(client.files.create(file=f, purpose="batch").id)
    ours = set(made)
    desc = [f.id for f in client.files.list(order="desc").data if f.id in ours]
    asc = [f.id for f in client.files.list(order="asc").data if f.id in ours]
    assert desc == made[::-1] and asc == made
    page = client.files.list(order="asc", after=made[5], limit=3).data
    assert [f.id for f in page] == made[6:9]
    batches = [
        client.batches.create(
            input_file_id=made[0], endpoint="/v1/chat/completions", completion_window="24h"
        ).id
        for _ in range(6)
    ]
    listed = [b.id for b in client.batches.list(limit=100).data]
    assert listed[:6] == batches[::-1]
    asc_page = httpx.get(
        server.url + "/v1/batches",
        params={"order": "asc", "after": batches[1], "limit": 2},
        headers=AUTH,
    ).json()
    assert [b["id"] for b in asc_page["data"]] == batches[2:4] and asc_page["has_more"]
    for bid in batches:
        serving.wait_done(client, bid)


def test_files_create_expires_after_is_honoured(server: serving.Server, tmp_path: Path) -> None:
    """expires_after sets expires_at; the file is gone (not listed, 404) once it passes."""
    client = server.client()
    path = write_jsonl(tmp_path / "in.jsonl", [chat_line("a", "x")])
    with path.open("rb") as f:
        made = client.files.create(
            file=f, purpose="batch", expires_after={"anchor": "created_at", "seconds": 2}
        )
    assert made.expires_at == made.created_at + 2
    with path.open("rb") as f, pytest.raises(openai.BadRequestError) as e:
        client.files.create(
            file=f,
            purpose="batch",
            expires_after={"anchor": "last_active_at", "seconds": 9},  # type: ignore[arg-type]
        )
    assert e.value.body["param"] == "expires_after.anchor"  # type: ignore[index]

    def gone() -> bool:
        return made.id not in {f.id for f in client.files.list().data}

    wait_until(gone, "the file expires", timeout=10)
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(made.id)
    assert not (server.root / "files" / f"{made.id}.jsonl").exists()


def test_an_input_of_blank_lines_fails_saying_why(server: serving.Server, tmp_path: Path) -> None:
    """errors.data holds an entry with a code and a message, OpenAI's shape."""
    client = server.client()
    path = tmp_path / "blank.jsonl"
    path.write_text("\n\n  \n\n")
    batch = serving.wait_done(client, serving.create_batch(client, path).id)
    assert batch.status == "failed"
    assert batch.errors is not None and batch.errors.data is not None
    entry = batch.errors.data[0]
    assert (entry.code, entry.message) == (
        "empty_file",
        "The input file holds no requests (it is empty or has only blank lines).",
    )


def test_metrics_totals_equal_the_sum_of_the_batches_request_counts(
    server: serving.Server, tmp_path: Path
) -> None:
    """Invalid lines are failed requests in /metrics as in request_counts."""
    client = server.client()
    lines: list[Any] = [chat_line(f"m{i}", f"x {i}") for i in range(20)]
    lines += ["not json", '{"custom_id": "bad"}']
    done = serving.wait_done(
        client, serving.create_batch(client, write_jsonl(tmp_path / "m.jsonl", lines)).id
    )
    assert done.request_counts is not None and done.request_counts.failed == 2
    listed = httpx.get(server.url + "/v1/batches", params={"limit": 100}, headers=AUTH).json()
    assert not listed["has_more"]
    assert all(b["status"] in ("completed", "failed", "cancelled") for b in listed["data"])
    completed = sum(b["request_counts"]["completed"] for b in listed["data"])
    failed = sum(b["request_counts"]["failed"] for b in listed["data"])
    text = httpx.get(server.url + "/metrics", headers=AUTH).text
    # prometheus_client writes every value as a float.
    assert f'batchrun_requests_total{{outcome="succeeded"}} {float(completed)}' in text.splitlines()
    assert f'batchrun_requests_total{{outcome="failed"}} {float(failed)}' in text.splitlines()
