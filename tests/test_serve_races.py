"""Races of `batchrun serve` decided on disk: random interleavings of create, cancel and finish
from several clients, with a kill -9 and a restart in the middle; and request counts that never
go back across a kill (echo engine)."""

from __future__ import annotations

import concurrent.futures
import json
import random
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from support import serving
from support.jobs import journal_records
from support.lines import chat_line, write_jsonl
from support.waits import wait_until

from batchrun.serve.batches import RECORD_NAME

pytestmark = pytest.mark.slow  # out of the fast tier: docs/development.md

AUTH = {"Authorization": f"Bearer {serving.API_KEY}"}
TERMINAL = ("completed", "failed", "expired", "cancelled")
ENGINE = ("--api-key", serving.API_KEY, "--batch-size", "8")
FAST = {"BATCHRUN_ECHO_DELAY_MS": "3"}


def _upload(server: serving.Server, path: Path) -> str:
    with path.open("rb") as f:
        answer = httpx.post(
            server.url + "/v1/files",
            files={"file": (path.name, f)},
            data={"purpose": "batch"},
            headers=AUTH,
        )
    answer.raise_for_status()
    return str(answer.json()["id"])


def _create_then_cancel(
    url: str, file_id: str, delay: float | None
) -> tuple[str, int | None, str | None]:
    """Create a batch, wait `delay`, cancel it (None: never): its id and the cancel's answer
    (status code and the status it showed; None and None when the server was gone)."""
    made = httpx.post(
        url + "/v1/batches",
        json={
            "input_file_id": file_id,
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
        },
        headers=AUTH,
        timeout=10,
    )
    made.raise_for_status()
    batch_id = str(made.json()["id"])
    if delay is None:
        return batch_id, None, None
    time.sleep(delay)
    try:
        answer = httpx.post(url + f"/v1/batches/{batch_id}/cancel", headers=AUTH, timeout=10)
    except httpx.HTTPError:
        return batch_id, None, None
    shown = answer.json().get("status") if answer.status_code == 200 else None
    return batch_id, answer.status_code, shown


def _round(
    server: serving.Server, files: list[str], rng: random.Random, n: int
) -> list[tuple[str, int | None, str | None]]:
    """`n` creates from 4 clients, most cancelled after a random moment (some at once, some
    while validating, running or finalizing)."""
    plans = [
        (rng.choice(files), None if rng.random() < 0.15 else rng.choice([0, rng.random() * 0.12]))
        for _ in range(n)
    ]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(_create_then_cancel, server.url, f, d) for f, d in plans]
        return [f.result() for f in futures]


def test_random_create_cancel_finish_and_kill_9_interleavings_keep_every_promise(
    tmp_path: Path,
) -> None:
    """A cancel answered `cancelling` ends `cancelled`; one answered `finalizing` is left as it
    is (it ends completed, or cancelled); a cancel of an ended batch is 400; no cancel is answered
    with a batch still validating or in progress; no batch goes cancelling -> completed; and every
    batch ends, across a kill -9 and a restart."""
    rng = random.Random(22)
    root = tmp_path / "root"
    server = serving.start_server(root, *ENGINE, env=FAST)
    files = [
        _upload(
            server,
            write_jsonl(tmp_path / f"in{n}.jsonl", [chat_line(f"r{i}", "x") for i in range(n)]),
        )
        for n in (1, 5, 20, 60)
    ]
    answers = _round(server, files, rng, 70)
    serving.stop_server(
        server, signal.SIGKILL
    )  # some batches validating, running, cancelling, finalizing
    server = serving.start_server(root, *ENGINE, env=FAST)
    try:
        answers += _round(server, files, rng, 70)
        ids = [batch_id for batch_id, _, _ in answers]
        final: dict[str, dict[str, Any]] = {}

        def all_ended() -> bool:
            for batch_id in ids:
                if batch_id not in final:
                    got = httpx.get(server.url + f"/v1/batches/{batch_id}", headers=AUTH).json()
                    if got["status"] in TERMINAL:
                        final[batch_id] = got
            return len(final) == len(ids)

        wait_until(all_ended, "every batch ends", timeout=90, every=0.2)
        # Whether a random cancel lands after its batch ended is up to timing; a cancel of an
        # ended batch is made certain here, one of each ending the rounds reached.
        late: list[tuple[str, int, str]] = []
        for status in sorted({got["status"] for got in final.values()}):
            batch_id = next(b for b, got in final.items() if got["status"] == status)
            answer = httpx.post(server.url + f"/v1/batches/{batch_id}/cancel", headers=AUTH)
            after = httpx.get(server.url + f"/v1/batches/{batch_id}", headers=AUTH).json()
            late.append((status, answer.status_code, after["status"]))
    finally:
        serving.stop_server(server)
    broken: list[str] = []
    for batch_id, code, shown in answers:
        end = final[batch_id]
        if end["status"] == "completed" and end["cancelling_at"] is not None:
            broken.append(f"{batch_id} went cancelling -> completed")
        if code is None:
            continue
        if code == 200 and shown == "cancelling" and end["status"] != "cancelled":
            broken.append(f"{batch_id}: cancel answered cancelling, ended {end['status']}")
        if code == 200 and shown in ("validating", "in_progress"):
            broken.append(f"{batch_id}: cancel answered with the batch still {shown}")
        if (
            code == 200
            and shown == "finalizing"
            and end["status"] not in ("completed", "cancelled")
        ):
            broken.append(f"{batch_id}: cancel answered finalizing, ended {end['status']}")
        if code not in (200, 400):
            broken.append(f"{batch_id}: cancel answered {code}")
        if end["status"] == "cancelled" and (end["cancelled_at"] is None or end["completed_at"]):
            broken.append(f"{batch_id}: cancelled without cancelled_at, or with completed_at")
    assert broken == []
    # The interleavings did reach each case (the test would prove little otherwise).
    shown_statuses = {shown for _, code, shown in answers if code == 200}
    assert "cancelling" in shown_statuses
    assert {"completed", "cancelled"} <= {status for status, _, _ in late}, late
    assert all(code == 400 and after == status for status, code, after in late), late


def test_request_counts_never_go_back_across_a_kill_9(tmp_path: Path) -> None:
    """The counts of a running batch reach batch.json as it runs: right after a kill -9 and a
    restart, the API shows at least what it showed before the kill, never 0/0/0."""
    root = tmp_path / "root"
    env = {"BATCHRUN_ECHO_DELAY_MS": "20"}
    server = serving.start_server(root, "--api-key", serving.API_KEY, "--batch-size", "4", env=env)
    path = write_jsonl(tmp_path / "in.jsonl", [chat_line(f"r{i}", "x") for i in range(2000)])
    file_id = _upload(server, path)
    batch_id, _, _ = _create_then_cancel(server.url, file_id, None)
    seen: dict[str, int] = {}

    def some_done() -> bool:
        got = httpx.get(server.url + f"/v1/batches/{batch_id}", headers=AUTH).json()
        seen.update(got["request_counts"])
        return seen["completed"] >= 100

    wait_until(some_done, "a hundred requests complete", timeout=60)
    time.sleep(1.5)  # past the interval at which counts are written
    serving.stop_server(server, signal.SIGKILL)
    on_disk = json.loads((root / "batches" / batch_id / RECORD_NAME).read_text())
    assert on_disk["batch"]["request_counts"]["completed"] >= seen["completed"]
    server = serving.start_server(root, "--api-key", serving.API_KEY, "--batch-size", "4", env=env)
    try:
        after = httpx.get(server.url + f"/v1/batches/{batch_id}", headers=AUTH).json()
        assert after["request_counts"]["total"] == 2000
        assert after["request_counts"]["completed"] >= seen["completed"]
    finally:
        serving.stop_server(server)


def test_a_cancel_while_finalizing_answers_the_batch_unchanged_and_it_completes(
    tmp_path: Path,
) -> None:
    """The finisher held between making the output file and saving its id (the crash harness's
    fault): a cancel then answers `finalizing`, unchanged, and the batch completes without a
    cancelling_at; a cancel of the completed batch is OpenAI's 400."""
    root = tmp_path / "root"
    env = {**FAST, "BATCHRUN_SERVE_PAUSE_AFTER_OUTPUT_S": "1.5"}
    server = serving.start_server(root, *ENGINE, env=env)
    try:
        path = write_jsonl(tmp_path / "in.jsonl", [chat_line(f"r{i}", "x") for i in range(5)])
        batch_id, _, _ = _create_then_cancel(server.url, _upload(server, path), None)

        def finalizing() -> bool:
            got = httpx.get(server.url + f"/v1/batches/{batch_id}", headers=AUTH).json()
            return bool(got["status"] == "finalizing")

        wait_until(finalizing, "the batch is finalizing", timeout=30, every=0.02)
        answer = httpx.post(server.url + f"/v1/batches/{batch_id}/cancel", headers=AUTH)
        assert (answer.status_code, answer.json()["status"]) == (200, "finalizing")
        assert answer.json()["cancelling_at"] is None

        def ended() -> bool:
            got = httpx.get(server.url + f"/v1/batches/{batch_id}", headers=AUTH).json()
            return bool(got["status"] in TERMINAL)

        wait_until(ended, "the batch ends", timeout=30)
        got = httpx.get(server.url + f"/v1/batches/{batch_id}", headers=AUTH).json()
        assert (got["status"], got["cancelling_at"]) == ("completed", None)
        again = httpx.post(server.url + f"/v1/batches/{batch_id}/cancel", headers=AUTH)
        assert again.status_code == 400
        assert again.json()["error"] == {
            "message": "cannot cancel a batch that is completed",
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_state",
        }
    finally:
        serving.stop_server(server)


def test_results_that_come_back_after_a_cancel_are_dropped(tmp_path: Path) -> None:
    """Requests in the engine when the batch is cancelled finish after it: they are dropped, not
    journaled, and the batch ends cancelled with only what finished before the cancel."""
    server = serving.start_server(tmp_path / "root", env={"BATCHRUN_ECHO_DELAY_MS": "3000"})
    try:
        client = server.client()
        batch = serving.create_batch(client, serving.requests_file(tmp_path / "in.jsonl", 20))
        wait_until(
            lambda: client.batches.retrieve(batch.id).status == "in_progress",
            "the batch is in progress",
        )
        time.sleep(0.5)  # dispatched, and 2.5 s from their answers
        assert client.batches.cancel(batch.id).status == "cancelling"
        done = serving.wait_done(client, batch.id, timeout=60)
        assert done.status == "cancelled"
        assert done.request_counts is not None and done.request_counts.completed == 0
        job = server.batch_dir(batch.id)
        assert not (job / "journal.jsonl").exists() or journal_records(job) == []
    finally:
        serving.stop_server(server)
