"""The batch store's transitions, index and persisted counts, in process (no server)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, cast

import pytest

import batchrun.serve.batches as batches_module
from batchrun.serve.batches import RECORD_NAME, BatchRecord, BatchStore, new_batch
from batchrun.serve.ids import new_batch_id


def _add(store: BatchStore, created_at: int | None = None) -> str:
    batch = new_batch(
        new_batch_id(), "file-" + "0" * 24, "/v1/chat/completions", "24h", 86400, None, "m"
    )
    if created_at is not None:
        batch["created_at"] = created_at
    store.add(BatchRecord(batch))
    return str(batch["id"])


def _on_disk(store: BatchStore, batch_id: str) -> dict[str, Any]:
    data = json.loads((store.job_dir(batch_id) / RECORD_NAME).read_text())
    return dict(data["batch"])


def test_a_transition_from_a_status_the_batch_has_left_changes_nothing(tmp_path: Path) -> None:
    """The validator's validating -> in_progress after a cancel (the lost cancel of the issue),
    and a cancel after the finisher ended the batch (`cancelling` over `completed`): refused."""
    store = BatchStore(tmp_path)
    bid = _add(store)
    assert store.transition(bid, ("validating", "in_progress"), status="cancelling") is not None
    assert store.transition(bid, ("validating",), status="in_progress") is None
    assert _on_disk(store, bid)["status"] == "cancelling"
    ended = store.end(bid, "completed")
    assert ended is not None and ended.status == "cancelled"  # a cancel that came first wins
    assert ended.batch["cancelled_at"] is not None and ended.batch["completed_at"] is None
    assert store.transition(bid, ("validating", "in_progress"), status="cancelling") is None
    assert store.end(bid, "failed") is None
    assert _on_disk(store, bid)["status"] == "cancelled"


def test_running_counts_are_written_at_a_bounded_rate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Counts reach batch.json (so a restart never shows 0/0/0), at most every COUNTS_SAVE_S."""
    monkeypatch.setattr(batches_module, "COUNTS_SAVE_S", 0.2)
    store = BatchStore(tmp_path)
    bid = _add(store)
    store.transition(bid, ("validating",), status="in_progress")
    store.set_counts(bid, 10, 3, 1)
    assert _on_disk(store, bid)["request_counts"] == {"total": 10, "completed": 3, "failed": 1}
    store.set_counts(bid, 10, 4, 1)  # within the interval: in memory only
    assert _on_disk(store, bid)["request_counts"]["completed"] == 3
    time.sleep(0.25)
    store.set_counts(bid, 10, 5, 1)
    assert _on_disk(store, bid)["request_counts"]["completed"] == 5
    again = BatchStore(tmp_path)
    assert again.counts()[1] == {"total": 10, "completed": 5, "failed": 1}


def test_pages_are_newest_first_stable_with_after_and_asc(tmp_path: Path) -> None:
    """Batches made in one second keep their creation order; after and order=asc honoured;
    the index survives a restart; counts by status follow each transition."""
    store = BatchStore(tmp_path)
    ids = [_add(store, created_at=1_700_000_000) for _ in range(7)]
    page, more = store.page(3)
    assert [b["id"] for b in page] == ids[::-1][:3] and more
    page, more = store.page(3, after=ids[4])
    assert [b["id"] for b in page] == [ids[3], ids[2], ids[1]] and more
    page, more = store.page(10, after=ids[1])
    assert [b["id"] for b in page] == [ids[0]] and not more
    page, more = store.page(3, order="asc")
    assert [b["id"] for b in page] == ids[:3] and more
    page, more = store.page(3, after=ids[4], order="asc")
    assert [b["id"] for b in page] == ids[5:] and not more
    assert store.page(3, after="batch_" + "f" * 24) == ([], False)
    assert [b["id"] for b in BatchStore(tmp_path).page(7)[0]] == ids[::-1]
    store.transition(ids[0], ("validating",), status="in_progress")
    store.end(ids[1], "failed", request_counts={"total": 2, "completed": 0, "failed": 2})
    assert store.counts() == (
        {"validating": 5, "in_progress": 1, "failed": 1},
        {"total": 2, "completed": 0, "failed": 2},
    )


def test_an_unexpected_error_is_a_json_500_with_an_id_that_is_logged(tmp_path: Path) -> None:
    """A bug in a handler: OpenAI's JSON error shape with status 500 and an id, never plain
    text; the server's log holds the traceback under the same id."""
    from starlette.testclient import TestClient

    from batchrun.serve.app import Services, create_app
    from batchrun.serve.files import FileStore
    from batchrun.serve.keys import Keys
    from batchrun.serve.metrics import Metrics
    from batchrun.serve.runner import Runner

    class Broken(BatchStore):
        def page(self, *args: object, **kwargs: object) -> tuple[list[dict[str, object]], bool]:
            raise RuntimeError("a bug")

    logged: list[str] = []
    # The runner is never started: no lifespan runs here.
    runner = cast(Runner, None)
    services = Services(
        FileStore(tmp_path), Broken(tmp_path), runner, Metrics(), "m", Keys([]), 1000, logged.append
    )
    client = TestClient(create_app(services), raise_server_exceptions=False)
    answer = client.get("/v1/batches", headers={"X-Client-Request-Id": "trace-1"})
    assert answer.status_code == 500
    # Answered past the request-id middleware, and still named by its request id.
    request_id = answer.headers["x-request-id"]
    assert request_id.startswith("req_") and answer.headers["x-client-request-id"] == "trace-1"
    assert answer.headers["content-type"] == "application/json"
    error = answer.json()["error"]
    error_id = error["message"].split("error id ")[1].rstrip(").")
    assert error == {
        "message": f"The server had an error while processing your request (error id {error_id}).",
        "type": "server_error",
        "param": None,
        "code": "internal_error",
    }
    assert len(logged) == 1 and error_id in logged[0] and "RuntimeError: a bug" in logged[0]
    assert logged[0].startswith(
        f"error {error_id} answering GET /v1/batches, "
        f"request {request_id} (client request id trace-1):\n"
    )
