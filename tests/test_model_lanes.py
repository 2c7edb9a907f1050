"""Several models on several workers at once (run/lanes.py), through the real CLI on the echo
engine: the workers shared out by each model's share of the work, every line run on an engine of
its own model, a worker whose model ran out moving to the one with the most left, a poison line
isolated on its own model's workers, kill -9 then resume answering each line once; and the
share-out rules themselves."""

from __future__ import annotations

import itertools
import json
import re
from collections import Counter
from pathlib import Path

import pytest
from support.cli import cli
from support.jobs import journal_records, start_echo, submit_echo
from support.lines import model_line
from support.processes import kill_9_after

from batchrun.run.lanes import MOVE_BATCHES, next_lane, share_out

WIDE = {"COLUMNS": "1000"}
TWO = ("--model", "small=org/small-model", "--model", "large=org/large-model")
BATCHES_OF_8 = (*TWO, "--batch-size", "8")  # the two models, 8 requests a batch


def _input(tmp_path: Path, models: list[str], **body: object) -> tuple[Path, dict[str, str]]:
    path = tmp_path / "in.jsonl"
    lines = [model_line(f"r{i}", m) for i, m in enumerate(models)]
    for line in lines:
        line["body"].update(body)
    path.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    return path, {f"r{i}": m for i, m in enumerate(models)}


def _env(record: Path, **extra: str) -> dict[str, str]:
    return {
        **WIDE,
        "BATCHRUN_ECHO_RECORD": str(record),
        "BATCHRUN_ECHO_RECORD_MODEL": "1",
        "BATCHRUN_ECHO_DELAY_MS": "20",
        **extra,
    }


def _received(record: Path) -> list[tuple[str, str]]:
    """(custom_id, the model of the engine that received it), in order."""
    return [tuple(line.split("\t")) for line in record.read_text().splitlines()]  # type: ignore[misc]


def _results(job: Path) -> list[dict[str, object]]:
    return [r for r in journal_records(job) if r["kind"] == "result"]


@pytest.mark.slow
def test_workers_are_shared_out_by_each_models_work_and_run_only_its_lines(
    tmp_path: Path,
) -> None:
    # 2 parts large to 1 part small, 3 workers: two run large and one small, from the start.
    models = ["large", "large", "small"] * 80
    src, model_of = _input(tmp_path, models)
    record, job = tmp_path / "record", tmp_path / "job"
    # Each worker's share takes 10 rounds of 250 ms: a worker of large that starts up to 1 s
    # after small's (process starts on a busy machine) still leaves large too little to be worth
    # a move (lanes.MOVE_BATCHES). At 20 ms a round, small's worker could finish before large's
    # had started, and rightly moved.
    r = submit_echo(
        src, job, *BATCHES_OF_8, "--workers", "3", env=_env(record, BATCHRUN_ECHO_DELAY_MS="250")
    )
    assert r.returncode == 0, r.stderr
    assert "running 2 models at once on 3 workers: small (80 requests), large (160 requests)" in (
        r.stderr
    )
    # Every line reached an engine of its own model, once.
    received = _received(record)
    assert all(model_of[cid] == engine for cid, engine in received)
    assert Counter(cid for cid, _ in received) == Counter(list(model_of))
    # The models ran side by side, not one pass after the other: the journal interleaves them.
    order = [model_of[str(x["custom_id"])] for x in _results(job)]
    switches = sum(1 for a, b in itertools.pairwise(order) if a != b)
    assert switches > 2, order
    # Each worker ran one model: two of them large's lines, one small's.
    by_worker: dict[object, set[str]] = {}
    for x in _results(job):
        by_worker.setdefault(x["worker"], set()).add(model_of[str(x["custom_id"])])
    assert sorted(tuple(sorted(m)) for m in by_worker.values()) == [
        ("large",),
        ("large",),
        ("small",),
    ], r.stderr
    assert "moving to model" not in r.stderr
    # status: each model's generated tokens a second of its own active time (the time one of
    # its attempts was in an engine: docs/metrics.md's glossary).
    status = json.loads(cli("status", "--job-dir", str(job), "--json").stdout)
    for name in ("small", "large"):
        mine = [x for x in _results(job) if model_of[str(x["custom_id"])] == name]
        tokens = sum(int(x["completion_tokens"]) for x in mine)  # type: ignore[call-overload]
        spans = sorted((float(x["time"]) - float(x["latency_s"]), float(x["time"])) for x in mine)  # type: ignore[arg-type]
        active, (start, end) = 0.0, spans[0]
        for s, e in spans[1:]:  # the union of the spans, merged in order of their starts
            if s > end:
                active, start = active + end - start, s
            end = max(end, e)
        active += end - start
        row = status["models"][name]
        assert row["tokens"]["completion"] == tokens
        assert row["completion_tokens_per_s"] == pytest.approx(tokens / active, rel=0.01)


def test_a_worker_whose_model_ran_out_moves_to_the_one_with_most_left(tmp_path: Path) -> None:
    models = ["small"] * 8 + ["large"] * 400
    src, model_of = _input(tmp_path, models)
    record, job = tmp_path / "record", tmp_path / "job"
    # Steps of 100 ms: large's 50 batches take one worker 5 s, time enough for the other to
    # move even on a loaded machine (at 20 ms the first worker once ran them all alone).
    env = _env(record, BATCHRUN_ECHO_DELAY_MS="100")
    r = submit_echo(src, job, *BATCHES_OF_8, "--workers", "2", env=env)
    assert r.returncode == 0, r.stderr
    assert re.search(r"worker \d moving to model large", r.stderr), r.stderr
    received = _received(record)
    assert all(model_of[cid] == engine for cid, engine in received)
    assert Counter(cid for cid, _ in received) == Counter(list(model_of))
    # Both workers ran large's lines in the end.
    large_workers = {x["worker"] for x in _results(job) if model_of[str(x["custom_id"])] == "large"}
    assert large_workers == {0, 1}


def test_a_poison_line_is_isolated_on_its_own_models_workers(tmp_path: Path) -> None:
    models = ["small", "large"] * 60
    src, model_of = _input(tmp_path, models)
    record, job = tmp_path / "record", tmp_path / "job"
    r = submit_echo(
        src, job, *BATCHES_OF_8, "--workers", "2", env=_env(record, BATCHRUN_ECHO_CRASH_ON="r6")
    )
    assert r.returncode == 1, r.stderr
    assert all(model_of[cid] == engine for cid, engine in _received(record))
    final = {str(x["custom_id"]): x for x in _results(job)}
    assert set(final) == set(model_of)
    failed = {cid for cid, x in final.items() if not x["ok"]}
    assert failed == {"r6"}
    assert final["r6"]["error"]["code"] == "engine_crash"  # type: ignore[index]


@pytest.mark.slow
def test_kill_9_mid_run_then_resume_answers_every_line_once(tmp_path: Path) -> None:
    models = ["large", "small", "large"] * 100
    src, model_of = _input(tmp_path, models)
    record, job = tmp_path / "record", tmp_path / "job"
    env = _env(record, BATCHRUN_ECHO_DELAY_MS="100")
    proc = start_echo(src, job, *BATCHES_OF_8, "--workers", "2", env=env)
    kill_9_after(proc, job, 60, timeout=60)
    done_before = {str(x["custom_id"]) for x in _results(job) if x["ok"]}
    assert 0 < len(done_before) < len(models)
    assert {model_of[c] for c in done_before} == {"small", "large"}
    r = cli("resume", "--job-dir", str(job), env=env)
    assert r.returncode == 0, r.stderr
    ok = Counter(str(x["custom_id"]) for x in _results(job) if x["ok"])
    assert ok == Counter(list(model_of))  # each exactly once, across both runs
    assert all(model_of[cid] == engine for cid, engine in _received(record))


def test_share_out_gives_every_model_a_worker_then_the_rest_by_share() -> None:
    assert share_out({"a": 300, "b": 100}, 4) == ["a", "a", "a", "b"]
    assert share_out({"a": 100, "b": 100, "c": 1}, 2) == ["a", "b"]
    assert share_out({"a": 10, "b": 1000}, 2) == ["b", "a"]
    assert share_out({"a": 5, "b": 0}, 3) == ["a", "a", "a"]
    assert share_out({}, 2) == []


def test_next_lane_prefers_a_model_without_workers_and_skips_small_remainders() -> None:
    batch = 8
    # A lane nobody runs wins, however little it has left.
    assert next_lane({"a": 1, "b": 10_000}, {"b": 1}, batch) == "a"
    # Too little left for the workers already on it: stay.
    assert next_lane({"b": MOVE_BATCHES * batch - 1}, {"b": 1}, batch) is None
    assert next_lane({"b": MOVE_BATCHES * batch}, {"b": 1}, batch) == "b"
    # The most left per worker.
    assert next_lane({"b": 1000, "c": 900}, {"b": 2, "c": 1}, batch) == "c"
    assert next_lane({"a": 0}, {}, batch) is None


def test_answers_stored_at_once_are_found_by_each_models_own_cache(tmp_path: Path) -> None:
    # Stored by a run of both models at once (one cache per model, run/lanes.RoutedAnswers),
    # then found by a run of one worker, model by model, which opens each model's cache alone.
    models = ["small", "large"] * 20
    src, model_of = _input(tmp_path, models, temperature=0)  # deterministic: cacheable
    cache = tmp_path / "cache"
    first, again = tmp_path / "first", tmp_path / "again"
    record = tmp_path / "record"
    r = submit_echo(
        src, first, *BATCHES_OF_8, "--workers", "2", "--cache-dir", str(cache), env=_env(record)
    )
    assert r.returncode == 0, r.stderr
    assert "running 2 models at once" in r.stderr
    assert not any(x.get("cached") for x in _results(first))
    assert len(_received(record)) == len(models)
    r = submit_echo(
        src, again, *BATCHES_OF_8, "--workers", "1", "--cache-dir", str(cache), env=_env(record)
    )
    assert r.returncode == 0, r.stderr
    cached = {str(x["custom_id"]) for x in _results(again) if x.get("cached")}
    assert cached == set(model_of)
    assert len(_received(record)) == len(models)  # no engine was asked anything more
