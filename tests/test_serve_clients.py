"""`batchrun serve` as OpenAI's clients meet it, through the `openai` package and plain HTTP on
the echo engine: free-form metadata (a priority batchrun does not know is kept, never refused),
`x-request-id` on every response (the package's `request_id` set), a batch's `model` from its
lines, and GET /v1/models/{id}."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai import AsyncOpenAI, OpenAI
from support import serving
from support.jobs import journal_records
from support.lines import chat_line
from support.waits import results_at_least, wait_until

from batchrun.serve.checks import check_metadata

SERVED = "org/echo-model"  # a served name with a slash: GET /v1/models/org/echo-model
REQUEST_ID = re.compile(r"req_[0-9a-f]{32}")
KEY = {"Authorization": f"Bearer {serving.API_KEY}"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[serving.Server]:
    """One server for this module: an API key, a served name with a slash, a slow echo engine."""
    root = tmp_path_factory.mktemp("serve-clients") / "root"
    s = serving.start_server(
        root,
        "--api-key",
        serving.API_KEY,
        "--served-model-name",
        SERVED,
        *serving.SLOW_ENGINE,
        env=serving.SLOW_ENV,
    )
    yield s
    serving.stop_server(s)


def logged(server: serving.Server, text: str) -> bool:
    """Whether the server's log holds `text` (its lines are written as they happen)."""
    return text in server.log.read_text()


# -- metadata ---------------------------------------------------------------------------------


def test_a_priority_batchrun_does_not_know_is_kept_and_echoed_not_refused(
    server: serving.Server, tmp_path: Path
) -> None:
    """The issue's 400 ("metadata.priority must be high, normal or low, got 'urgent'") is gone:
    the batch is made, runs at normal priority, and its metadata comes back as sent."""
    client = server.client()
    metadata = {"priority": "urgent", "team": "search", "batchrun_priority": "asap"}
    batch = serving.create_batch(
        client, serving.requests_file(tmp_path / "in.jsonl", 5), metadata=metadata
    )
    assert batch.metadata == metadata
    assert client.batches.retrieve(batch.id).metadata == metadata
    listed = {b.id: b for b in client.batches.list(limit=100).data}
    assert listed[batch.id].metadata == metadata
    done = serving.wait_done(client, batch.id)
    assert done.status == "completed" and done.metadata == metadata
    record = json.loads((server.batch_dir(batch.id) / "batch.json").read_text())
    assert record["priority"] == "normal"


def test_openais_metadata_limits_hold(server: serving.Server, tmp_path: Path) -> None:
    """16 keys of 64 characters with values of 512 are taken; one more key, a longer key or a
    longer value is OpenAI's 400, param metadata."""
    client = server.client()
    path = serving.requests_file(tmp_path / "in.jsonl", 1)
    widest = {f"{i:02d}".ljust(64, "k"): "v" * 512 for i in range(16)}
    assert serving.create_batch(client, path, metadata=widest).metadata == widest
    too_many = {**widest, "one-more": "x"}
    for bad, message in (
        (too_many, "metadata holds at most 16 keys"),
        ({"k" * 65: "x"}, "metadata keys are at most 64 characters, values 512"),
        ({"k": "v" * 513}, "metadata keys are at most 64 characters, values 512"),
    ):
        with pytest.raises(openai.BadRequestError) as e:
            serving.create_batch(client, path, metadata=bad)
        assert e.value.body == {
            "message": message,
            "type": "invalid_request_error",
            "param": "metadata",
            "code": None,
        }


def test_which_metadata_key_steers_the_queue() -> None:
    """batchrun_priority, then priority, the first holding high, normal or low; else normal."""
    cases: list[tuple[dict[str, str] | None, str]] = [
        (None, "normal"),
        ({}, "normal"),
        ({"priority": "high"}, "high"),
        ({"priority": "low"}, "low"),
        ({"priority": "urgent"}, "normal"),
        ({"priority": "HIGH"}, "normal"),  # the values are exact
        ({"batchrun_priority": "low", "priority": "high"}, "low"),
        ({"batchrun_priority": "someday", "priority": "high"}, "high"),
        ({"batchrun_priority": "high", "priority": "p1"}, "high"),
    ]
    assert [check_metadata(m) for m, _ in cases] == [want for _, want in cases]


def test_batchrun_priority_comes_before_priority_in_the_queue(
    server: serving.Server, tmp_path: Path
) -> None:
    """While a normal batch runs, three arrive: one tagged priority high but batchrun_priority
    low (low), one tagged priority p0 (an unknown value: normal), one tagged priority low but
    batchrun_priority high (high). The high one runs first, the low one last."""
    client = server.client()
    normal = serving.create_batch(client, serving.requests_file(tmp_path / "n.jsonl", 600, "n"))
    wait_until(results_at_least(server.batch_dir(normal.id), 20), "the normal batch runs")
    low = serving.create_batch(
        client,
        serving.requests_file(tmp_path / "l.jsonl", 100, "l"),
        metadata={"priority": "high", "batchrun_priority": "low"},
    )
    unknown = serving.create_batch(
        client, serving.requests_file(tmp_path / "u.jsonl", 100, "u"), metadata={"priority": "p0"}
    )
    high = serving.create_batch(
        client,
        serving.requests_file(tmp_path / "h.jsonl", 100, "h"),
        metadata={"priority": "low", "batchrun_priority": "high"},
    )
    for b in (normal, low, unknown, high):
        assert serving.wait_done(client, b.id, timeout=60).status == "completed"

    def span(batch_id: str) -> tuple[float, float]:
        times = [
            r["time"] for r in journal_records(server.batch_dir(batch_id)) if r["kind"] == "result"
        ]
        return min(times), max(times)

    assert span(high.id)[1] < span(normal.id)[1] < span(unknown.id)[1] < span(low.id)[1]
    assert span(high.id)[1] <= span(low.id)[0] and span(unknown.id)[1] <= span(low.id)[0]


# -- request ids ------------------------------------------------------------------------------


def test_every_response_carries_a_request_id_errors_and_health_included(
    server: serving.Server, tmp_path: Path
) -> None:
    """Plain HTTP: success, 400, 401, 404, 405, 413 (refused by the guard, before any route)
    and the open /health and /metrics each carry their own `x-request-id`, OpenAI's form."""
    url = server.url
    with httpx.Client(timeout=30) as http:
        answers = {
            "health": http.get(f"{url}/health"),
            "metrics": http.get(f"{url}/metrics", headers=KEY),
            "models": http.get(f"{url}/v1/models", headers=KEY),
            "batches": http.get(f"{url}/v1/batches", headers=KEY),
            "no key": http.get(f"{url}/v1/batches"),
            "unknown path": http.get(f"{url}/v1/nothing", headers=KEY),
            "unknown batch": http.get(f"{url}/v1/batches/batch_{'0' * 24}", headers=KEY),
            "bad json": http.post(
                f"{url}/v1/batches",
                content=b"{not json",
                headers={**KEY, "Content-Type": "application/json"},
            ),
            "too large": http.post(
                f"{url}/v1/batches",
                content=b"x" * (1024 * 1024 + 1),
                headers={**KEY, "Content-Type": "application/json"},
            ),
            "wrong method": http.delete(f"{url}/v1/batches", headers=KEY),
        }
    statuses = {name: r.status_code for name, r in answers.items()}
    assert statuses == {
        "health": 200,
        "metrics": 200,
        "models": 200,
        "batches": 200,
        "no key": 401,
        "unknown path": 404,
        "unknown batch": 404,
        "bad json": 400,
        "too large": 413,
        "wrong method": 405,
    }
    ids = {name: r.headers.get("x-request-id") for name, r in answers.items()}
    assert all(REQUEST_ID.fullmatch(str(i)) for i in ids.values()), ids
    assert len(set(ids.values())) == len(ids)
    for name in ("no key", "unknown path", "unknown batch", "bad json", "too large"):
        assert set(answers[name].json()["error"]) == {"message", "type", "param", "code"}


def test_the_openai_package_reads_the_request_id_of_answers_and_errors(
    server: serving.Server, tmp_path: Path
) -> None:
    """The sync and async clients: `_request_id` on parsed objects, `request_id` on raw
    responses and on the errors they raise (a 404 and the 401 of a wrong key)."""
    client = server.client()
    with serving.requests_file(tmp_path / "in.jsonl", 2).open("rb") as f:
        uploaded = client.files.create(file=f, purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    raw = client.batches.with_raw_response.retrieve(batch.id)
    assert raw.parse()._request_id == raw.request_id  # one response
    seen = [
        uploaded._request_id,
        batch._request_id,
        raw.request_id,
        client.models.list()._request_id,
    ]
    with pytest.raises(openai.NotFoundError) as missing:
        client.batches.retrieve(f"batch_{'0' * 24}")
    with pytest.raises(openai.AuthenticationError) as refused:
        server.client("wrong").batches.list()
    seen += [missing.value.request_id, refused.value.request_id]

    async def from_async() -> list[str | None]:
        aclient = AsyncOpenAI(
            base_url=f"{server.url}/v1", api_key=serving.API_KEY, max_retries=0, timeout=30
        )
        async with aclient:
            got = await aclient.batches.retrieve(batch.id)
            try:
                await aclient.files.retrieve(f"file-{'0' * 24}")
            except openai.NotFoundError as e:
                return [got._request_id, e.request_id]
        raise AssertionError("an unknown file was found")

    seen += asyncio.run(from_async())
    assert all(REQUEST_ID.fullmatch(str(i)) for i in seen), seen
    assert len(set(seen)) == len(seen)
    serving.wait_done(client, batch.id)


def test_a_client_request_id_is_logged_beside_the_servers_and_echoed(
    server: serving.Server,
) -> None:
    """A request with `X-Client-Request-Id` is logged with both ids (and the client's is sent
    back); a plain successful poll is not logged; a change and an error are."""
    client = server.client()
    traced = client.batches.with_raw_response.list(
        extra_headers={"X-Client-Request-Id": "trace-7f3a"}
    )
    assert traced.headers["x-client-request-id"] == "trace-7f3a"
    line = f"request {traced.request_id} (client request id trace-7f3a): GET /v1/batches 200"
    wait_until(lambda: logged(server, line), "the traced request is logged")
    with httpx.Client(timeout=30) as http:
        poll = http.get(f"{server.url}/v1/batches?limit=1", headers=KEY)
        error = http.get(f"{server.url}/v1/files/file-{'0' * 24}", headers=KEY)
        too_long = http.get(
            f"{server.url}/v1/batches", headers={**KEY, "X-Client-Request-Id": "x" * 513}
        )
    assert "x-client-request-id" not in poll.headers
    error_line = f"request {error.headers['x-request-id']}: GET /v1/files/file-{'0' * 24} 404"
    wait_until(lambda: logged(server, error_line), "the error is logged")
    # Past OpenAI's 512 characters a client's id is ignored: neither sent back nor logged.
    assert "x-client-request-id" not in too_long.headers
    log = server.log.read_text()
    assert poll.headers["x-request-id"] not in log
    assert too_long.headers["x-request-id"] not in log and "x" * 513 not in log


# -- the batch's model ------------------------------------------------------------------------


def test_a_batchs_model_is_the_model_its_first_line_names(
    server: serving.Server, tmp_path: Path
) -> None:
    """OpenAI's Batch `model`: the model the lines name (the first line's, with several), not
    the engine; a line that names none is passed over; no line naming one: the served model."""
    client = server.client()

    def named(lines: list[dict[str, Any] | str]) -> str:
        path = tmp_path / f"in-{len(list(tmp_path.iterdir()))}.jsonl"
        path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
        batch = serving.create_batch(client, path)
        assert client.batches.retrieve(batch.id).model == batch.model
        assert serving.wait_done(client, batch.id).model == batch.model
        return str(batch.model)

    def line(cid: str, model: str | None) -> dict[str, Any]:
        made = chat_line(cid, "hi")
        if model is None:
            del made["body"]["model"]
        else:
            made["body"]["model"] = model
        return made

    assert named([line("a", "gpt-4o-mini"), line("b", "gpt-4o-mini")]) == "gpt-4o-mini"
    assert named([line("a", "first-model"), line("b", "second-model")]) == "first-model"
    assert named(["not json", line("a", None), line("b", "named-later")]) == "named-later"
    assert named([line("a", None)]) == SERVED


# -- GET /v1/models/{id} ----------------------------------------------------------------------


def test_each_listed_model_can_be_retrieved_and_an_unknown_one_is_openais_404(
    server: serving.Server,
) -> None:
    """GET /v1/models/{id} answers the entry GET /v1/models lists, for an id with a slash too;
    an unknown id is a 404 `model_not_found` in OpenAI's error shape."""
    client = server.client()
    listed = client.models.list().data
    assert [m.id for m in listed] == [SERVED]
    for entry in listed:
        got = client.models.retrieve(entry.id)
        assert got.model_dump() == entry.model_dump()
        assert REQUEST_ID.fullmatch(str(got._request_id))
    for unknown in ("gpt-9", "org/other-model", "org", f"{SERVED}/more"):
        with pytest.raises(openai.NotFoundError) as e:
            client.models.retrieve(unknown)
        assert e.value.body == {
            "message": f"The model `{unknown}` does not exist: GET /v1/models lists this "
            "server's models",
            "type": "invalid_request_error",
            "param": None,
            "code": "model_not_found",
        }
    with httpx.Client(timeout=30) as http:
        plain = http.get(f"{server.url}/v1/models/{SERVED}", headers=KEY)
        unkeyed = http.get(f"{server.url}/v1/models/{SERVED}")
        whole = http.get(f"{server.url}/v1/models", headers=KEY).json()
    assert plain.status_code == 200 and plain.json() == whole["data"][0]
    assert unkeyed.status_code == 401 and REQUEST_ID.fullmatch(unkeyed.headers["x-request-id"])


def test_several_models_each_retrieved(tmp_path: Path) -> None:
    """With several base models, each is retrieved by its id (adapters are covered by the
    same lookup: one list, one answer per id)."""
    server = serving.start_server(
        tmp_path / "root", "--model", "a=org/a-model", "--model", "b=org/b-model"
    )
    try:
        client: OpenAI = server.client()
        roots = [(client.models.retrieve(i).model_extra or {}).get("root") for i in ("a", "b")]
        assert roots == ["org/a-model", "org/b-model"]
        with pytest.raises(openai.NotFoundError):
            client.models.retrieve("org/a-model")  # a path, not a served name
    finally:
        serving.stop_server(server)
