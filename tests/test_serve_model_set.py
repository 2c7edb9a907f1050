"""`batchrun serve` restarted with another set of `--model` names while a batch was in flight
(echo engine, real server processes, kill -9): each unfinished line whose model the restarted
server does not run is journaled once as a `model_not_found` error record naming the model and
the server's models, the lines of the models it runs still run, and the batch completes. The
restart with the same set is tests/test_serve_models.py's kill -9 test (nothing of this runs)."""

from __future__ import annotations

import signal
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from support import serving
from support.cli import cli
from support.jobs import journal_records
from support.lines import model_line, write_jsonl
from support.processes import group_alive
from support.waits import results_at_least, wait_until

pytestmark = pytest.mark.slow  # out of the fast tier: docs/development.md

# With SLOW's 2 at a time: about 50 requests a second, slow enough to kill mid-batch.
ENV = {"BATCHRUN_ECHO_DELAY_MS": "40"}


def _killed_after(server: serving.Server, batch_id: str, results: int, total: int) -> Path:
    """Kill -9 `server` (and its engine) once its batch has `results` journal records; returns
    the batch's job directory."""
    job = server.batch_dir(batch_id)
    wait_until(results_at_least(job, results), f"{results} lines finish", timeout=60)
    serving.stop_server(server, signal.SIGKILL)
    wait_until(lambda: not group_alive(server.process.pid), "the killed server's processes end")
    assert len(journal_records(job)) < total  # killed mid-batch
    return job


def _ended(
    root: Path, batch_id: str, *models: str
) -> tuple[Any, dict[str, str], dict[str, Any], str]:
    """Restart on `root` with `models`; wait for the batch to end. Returns the batch, the
    output's model per custom_id, the error file's error per custom_id, and the server's log."""
    server = serving.start_server(root, *models, *serving.SLOW, env=ENV)
    try:
        client = server.client()
        done = serving.wait_done(client, batch_id, timeout=60)
        output = serving.lines_of(client, done.output_file_id) if done.output_file_id else []
        errors = serving.lines_of(client, done.error_file_id) if done.error_file_id else []
    finally:
        serving.stop_server(server)
    ids = [x["custom_id"] for x in output + errors]
    assert len(ids) == len(set(ids))  # each custom_id once, in one of the two files
    answers = {x["custom_id"]: x["response"]["body"]["model"] for x in output}
    return done, answers, {x["custom_id"]: x["error"] for x in errors}, server.log.read_text()


def _once(job: Path) -> Counter[str]:
    """How many journal records (results) each custom_id has."""
    return Counter(x["custom_id"] for x in journal_records(job) if x["kind"] == "result")


def test_restart_with_only_a_ends_bs_unfinished_lines_as_model_not_found(tmp_path: Path) -> None:
    """Killed in a's pass: a's unfinished lines still run on the restarted server of `a` alone
    (a one-model server, by name); each of b's lines is an error record naming b."""
    root = tmp_path / "root"
    models = ["a", "b"] * 40
    lines = [model_line(f"r{i:02d}", m) for i, m in enumerate(models)]
    first = serving.start_server(root, *serving.TWO, *serving.SLOW, env=ENV)
    batch = serving.create_batch(first.client(), write_jsonl(tmp_path / "in.jsonl", lines))
    job = _killed_after(first, batch.id, 10, len(lines))
    before = {x["custom_id"] for x in journal_records(job)}
    assert before and all(models[int(c[1:])] == "a" for c in before)  # still in a's pass
    done, answers, errors, log = _ended(root, batch.id, "--model", "a=org/a-model")
    assert done.status == "completed"
    assert done.request_counts is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (40, 40)
    # a's answers are a's, every one of them, those after the kill too.
    assert answers == {f"r{i:02d}": "a" for i, m in enumerate(models) if m == "a"}
    expected = {
        "code": "model_not_found",
        "message": "body.model 'b' is no model of this server (it was restarted with other "
        "models since the batch was accepted); known: a (the base model)",
    }
    assert errors == {
        f"r{i:02d}": {**expected, "line": i + 1} for i, m in enumerate(models) if m == "b"
    }
    assert set(_once(job).values()) == {1}  # journaled once each
    said = [x for x in log.splitlines() if "model_not_found" in x]
    assert said == [
        f"[batchrun serve] batch {batch.id}: 40 unfinished lines of model b (40) end as "
        "model_not_found errors: this server runs a"
    ], log


def test_restart_with_a_and_c_keeps_bs_answers_and_ends_the_rest(tmp_path: Path) -> None:
    """Killed in b's pass: b's lines answered before the kill stay answered; the others are
    error records naming b and the models a, c the restarted server runs."""
    root = tmp_path / "root"
    models = ["a", "b"] * 60
    lines = [model_line(f"r{i:03d}", m) for i, m in enumerate(models)]
    first = serving.start_server(root, *serving.TWO, *serving.SLOW, env=ENV)
    batch = serving.create_batch(first.client(), write_jsonl(tmp_path / "in.jsonl", lines))
    job = _killed_after(first, batch.id, 70, len(lines))
    answered = {x["custom_id"] for x in journal_records(job) if x["ok"]}
    b_before = {c for c in answered if models[int(c[1:])] == "b"}
    assert len(answered) == len(b_before) + 60 and b_before  # a's all done, b's some
    done, answers, errors, log = _ended(
        root, batch.id, "--model", "a=org/a-model", "--model", "c=org/c-model"
    )
    assert done.status == "completed"
    b_after = {f"r{i:03d}" for i, m in enumerate(models) if m == "b"} - b_before
    assert answers == {c: models[int(c[1:])] for c in answered}  # as before the kill
    message = (
        "body.model 'b' is no model of this server (it was restarted with other models since "
        "the batch was accepted); known: a, c"
    )
    assert errors == {
        c: {"code": "model_not_found", "message": message, "line": int(c[1:]) + 1} for c in b_after
    }
    assert set(_once(job).values()) == {1}
    assert f"{len(b_after)} unfinished lines of model b ({len(b_after)})" in log
    assert "runs model c" not in log and "runs model a" not in log  # no engine needed


def test_one_model_batch_is_never_answered_by_named_models_it_was_not_accepted_on(
    tmp_path: Path,
) -> None:
    """A one-model server answers any name (its file names one model, OpenAI's rule): its
    unfinished batch, whose lines name a, would be answered by another model on a server of the
    models a and b. That start is refused in one line naming both values (exit 2), and the
    root's own settings (`--root` alone) finish the batch on the model it began with."""
    root = tmp_path / "root"
    lines = [model_line(f"one-{i:02d}", "a") for i in range(60)]
    first = serving.start_server(root, "--model", "m=org/m-model", *serving.SLOW, env=ENV)
    one = serving.create_batch(first.client(), write_jsonl(tmp_path / "one.jsonl", lines))
    job = _killed_after(first, one.id, 10, len(lines))
    refused = cli("serve", "--root", str(root), "--engine", "echo", *serving.TWO)
    assert refused.returncode == 2
    assert refused.stderr.strip() == (
        "error: --model a=org/a-model, b=org/b-model differs from this root's --model "
        "m=org/m-model, which its 1 unfinished batch was accepted on (a batch is never answered "
        "by two models): start it with --model m=org/m-model (or with --root alone) to finish "
        "them, or use another --root"
    )
    done, answers, errors, log = _ended(root, one.id)
    assert done.status == "completed" and not errors
    assert answers == {f"one-{i:02d}": "a" for i in range(60)}  # answered as it asked, by m
    assert "model_not_found" not in log and "runs model" not in log
    assert set(_once(job).values()) == {1}
