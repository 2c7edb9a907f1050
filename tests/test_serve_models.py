"""`batchrun serve` with several base models (--model NAME=PATH, repeated) on the echo engine:
/v1/models lists each model and each adapter with its parent; a batch mixing models, and a
second batch in flight with it, are answered line by line by the model each line names (the
pool switches model by model); an unknown or missing name is a `model_not_found` error record;
usage errors are one line."""

from __future__ import annotations

import json
import re
import signal
from collections import Counter
from pathlib import Path

import pytest
from support import serving
from support.cli import cli
from support.jobs import journal_records
from support.lines import model_line, write_jsonl
from support.processes import group_alive
from support.waits import results_at_least, wait_until
from testmodels.lora import make_adapter

pytestmark = pytest.mark.slow  # out of the fast tier: docs/development.md

WIDE = {"COLUMNS": "1000"}


def _adapter_spec(tmp_path: Path, name: str, base: str | None) -> str:
    path = make_adapter(tmp_path / name, seed=len(name))
    spec: dict[str, str] = {"name": name, "path": str(path)}
    if base is not None:
        spec["base_model_name"] = base
    return json.dumps(spec)


def test_models_lists_each_base_model_then_each_adapter_with_its_parent(tmp_path: Path) -> None:
    server = serving.start_server(
        tmp_path / "root",
        *serving.TWO,
        "--lora-modules",
        _adapter_spec(tmp_path, "for-a", None),  # naming no base: the first model's
        "--lora-modules",
        _adapter_spec(tmp_path, "for-b", "b"),
    )
    try:
        listed = server.client().models.list().data
    finally:
        serving.stop_server(server)
    assert [(m.id, m.model_extra["parent"], m.model_extra["root"]) for m in listed] == [
        ("a", None, "org/a-model"),
        ("b", None, "org/b-model"),
        ("for-a", "a", str(tmp_path / "for-a")),
        ("for-b", "b", str(tmp_path / "for-b")),
    ]
    assert "models a, b on echo" in server.log.read_text()


def _engine_models(log: str) -> list[str]:
    """The model of each engine start, in order, from the server's log."""
    return re.findall(r"worker 0 runs model (\S+) ", log)


def _runs(received: list[str], model_of: dict[str, str]) -> list[str]:
    """The base models of the requests the engines received, in order, each run of one model
    once: the models the engines must have run, start by start."""
    runs: list[str] = []
    for cid in received:
        if not runs or runs[-1] != model_of[cid]:
            runs.append(model_of[cid])
    return runs


def test_a_batch_mixing_models_and_one_in_flight_beside_it_are_answered_by_each_lines_model(
    tmp_path: Path,
) -> None:
    record = tmp_path / "received.txt"
    server = serving.start_server(
        tmp_path / "root",
        *serving.TWO,
        *serving.SLOW,
        "--lora-modules",
        _adapter_spec(tmp_path, "b-tuned", "b"),
        env={
            "BATCHRUN_ECHO_DELAY_MS": "40",
            "BATCHRUN_ECHO_RECORD": str(record),
            # A line of each model fails every attempt: its retries run on its own model too.
            "BATCHRUN_ECHO_FAIL": "one-0,one-1",
        },
    )
    first = ["a", "b", "b-tuned", "a", "b"] * 8 + ["zz", None]
    second = ["b", "a"] * 6
    lines1 = [model_line(f"one-{i}", m) for i, m in enumerate(first)]
    lines2 = [model_line(f"two-{i}", m) for i, m in enumerate(second)]
    try:
        client = server.client()
        batch1 = serving.create_batch(client, write_jsonl(tmp_path / "one.jsonl", lines1))
        wait_until(
            lambda: client.batches.retrieve(batch1.id).status == "in_progress",
            "the first batch runs",
        )
        batch2 = serving.create_batch(client, write_jsonl(tmp_path / "two.jsonl", lines2))
        # The second batch came while the first one ran: both are in flight at once.
        assert client.batches.retrieve(batch1.id).status not in serving.DONE
        done1 = serving.wait_done(client, batch1.id, timeout=60)
        done2 = serving.wait_done(client, batch2.id, timeout=60)
        answers = {
            line["custom_id"]: line["response"]["body"]["model"]
            for done in (done1, done2)
            for line in serving.lines_of(client, done.output_file_id)
        }
        errors = {e["custom_id"]: e["error"] for e in serving.lines_of(client, done1.error_file_id)}
    finally:
        serving.stop_server(server)
    assert (done1.status, done2.status) == ("completed", "completed")
    assert done2.error_file_id is None
    # Each valid line answered once, reporting the name it asked for.
    asked = {x["custom_id"]: x["body"]["model"] for x in lines1[:40] + lines2}
    assert answers == {cid: m for cid, m in asked.items() if cid not in ("one-0", "one-1")}
    for batch in (batch1, batch2):
        results = [
            x["custom_id"]
            for x in journal_records(server.batch_dir(batch.id))
            if x["kind"] == "result" and x["ok"]
        ]
        assert len(results) == len(set(results))  # no line answered twice
    assert {cid: errors.pop(cid)["code"] for cid in ("one-0", "one-1")} == {
        "one-0": "engine_error",
        "one-1": "engine_error",
    }
    assert errors == {
        "one-40": {
            "code": "model_not_found",
            "message": "body.model 'zz' is no model of this job; known: a, b, b-tuned",
            "line": 41,
        },
        "one-41": {
            "code": "model_not_found",
            "message": "body.model is missing and this job runs several models; known: a, b, "
            "b-tuned",
            "line": 42,
        },
    }
    # Every valid line reached an engine once, and the engines ran the models the lines needed
    # in the order they got them: a run of a's lines on an engine of a, then b's (its adapter's
    # with them) on an engine of b, and so on; no line of one model on the other's engine.
    received = record.read_text().split()
    tries = [received.count(cid) for cid in ("one-0", "one-1")]
    assert set(received) == set(asked) and tries[0] == tries[1] > 1
    assert len(received) == len(asked) + 2 * (tries[0] - 1)
    base = {cid: "b" if m == "b-tuned" else m for cid, m in asked.items()}
    log = server.log.read_text()
    starts = _engine_models(log)
    assert starts == _runs(received, base), log
    # Two batches on two models: each batch runs model by model, the second one starting on the
    # model loaded when it came; at most one switch back.
    assert 2 <= len(starts) <= 3, log
    status = json.loads(
        cli("status", "--job-dir", str(server.batch_dir(batch1.id)), "--json").stdout
    )
    assert {n: c["completed"] for n, c in status["models"].items()} == {
        "a": 15,
        "b": 15,
        "b-tuned": 8,
    }


def test_kill_9_in_the_second_models_pass_then_restart_answers_each_line_once(
    tmp_path: Path,
) -> None:
    root = tmp_path / "root"
    env = {"BATCHRUN_ECHO_DELAY_MS": "40"}
    models = ["a", "b"] * 100
    lines = [model_line(f"r{i:03d}", m) for i, m in enumerate(models)]
    first = serving.start_server(root, *serving.TWO, *serving.SLOW, env=env)
    client = first.client()
    batch = serving.create_batch(client, write_jsonl(tmp_path / "in.jsonl", lines))
    job = first.batch_dir(batch.id)
    wait_until(results_at_least(job, 130), "a's 100 lines and some of b's finish", timeout=60)
    serving.stop_server(first, signal.SIGKILL)
    wait_until(lambda: not group_alive(first.process.pid), "the killed server's processes are gone")
    assert "runs model b" in first.log.read_text()
    assert len(journal_records(job)) < len(lines)  # killed mid-batch
    second = serving.start_server(root, *serving.TWO, *serving.SLOW, env=env)
    try:
        client = second.client()
        done = serving.wait_done(client, batch.id, timeout=60)
        answers = {
            x["custom_id"]: x["response"]["body"]["model"]
            for x in serving.lines_of(client, done.output_file_id)
        }
    finally:
        serving.stop_server(second)
    assert done.status == "completed"
    assert answers == {f"r{i:03d}": m for i, m in enumerate(models)}
    ok = Counter(x["custom_id"] for x in journal_records(job) if x["kind"] == "result" and x["ok"])
    assert set(ok.values()) == {1} and len(ok) == len(lines)
    # a's lines were all done: the restarted server starts b's engine only.
    assert _engine_models(second.log.read_text()) == ["b"]


def test_one_model_with_a_name_serves_as_before(tmp_path: Path) -> None:
    server = serving.start_server(tmp_path / "root", "--model", "only=org/only-model")
    try:
        client = server.client()
        lines = [model_line("r0", "anything"), model_line("r1", "anything")]
        done = serving.wait_done(
            client, serving.create_batch(client, write_jsonl(tmp_path / "in.jsonl", lines)).id
        )
        answers = [
            x["response"]["body"]["model"] for x in serving.lines_of(client, done.output_file_id)
        ]
        listed = [m.id for m in client.models.list().data]
    finally:
        serving.stop_server(server)
    assert done.status == "completed" and answers == ["anything", "anything"]
    assert listed == ["only"]
    assert "switching to model" not in server.log.read_text()


@pytest.mark.parametrize(
    ("models", "message"),
    [
        (
            ("--model", "a=org/a-model", "--model", "org/b-model"),
            "mixes a plain value with NAME=PATH values ('org/b-model'); with several models "
            "give each as NAME=PATH",
        ),
        (
            ("--model", "a=org/a-model", "--model", "a=org/b-model"),
            "names the model 'a' twice",
        ),
    ],
)
def test_a_bad_model_list_is_one_line_and_serves_nothing(
    tmp_path: Path, models: tuple[str, ...], message: str
) -> None:
    root = tmp_path / "root"
    r = cli("serve", "--root", str(root), "--engine", "echo", *models, env=WIDE)
    assert r.returncode == 2, r.stderr
    # As submit says it (typer names the option's environment variable too).
    assert "Invalid value for '--model' (env var: 'BATCHRUN_MODEL'): " + message in r.stderr
    assert "Traceback" not in r.stderr
    assert not root.exists()
