"""Several base models in one job (--model NAME=PATH, repeated) through the real CLI on the echo
engine: usage errors, lines routed by body.model (an unknown or missing name an error record),
one engine start per model, the retry passes and retry-failed per model, status's per-model
counts, adapters belonging to their base, kill -9 then resume across a model switch, serve's
/v1/models (serve with several models: tests/test_serve_models.py); and one real-vLLM job of two
models (marked vllm: 2 engine starts)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support.cli import cli
from support.jobs import answer_models, journal_records, rerun, start_echo, submit_echo
from support.lines import model_input, model_line, read_jsonl
from support.processes import kill_9_after
from testmodels.lora import make_adapter

from batchrun.openai.routing import KnownModels

# Usage errors in one line (rich boxes them at the terminal's width).
WIDE = {"COLUMNS": "1000"}
TWO = ("--model", "small=org/small-model", "--model", "large=org/large-model")
STARTS = "starting echo engine"


def _input(tmp_path: Path, models: list[str | None]) -> Path:
    return model_input(tmp_path / "in.jsonl", models)


def _submit(src: Path, job: Path, *args: str, env: dict[str, str] | None = None) -> Any:
    return submit_echo(src, job, *args, env={**WIDE, **(env or {})})


def test_lines_run_on_the_model_they_name_one_engine_start_per_model(tmp_path: Path) -> None:
    models = ["small", "large", "large", None, "small", "medium", "large"]
    job = tmp_path / "job"
    r = _submit(_input(tmp_path, models), job, *TWO)
    assert r.returncode == 1, r.stderr  # the two lines naming no model of the job
    assert answer_models(job) == {
        "r0": "small",
        "r1": "large",
        "r2": "large",
        "r4": "small",
        "r6": "large",
    }
    errors = {e["custom_id"]: e["error"] for e in read_jsonl(job / "errors.jsonl")}
    assert errors == {
        "r3": {
            "code": "model_not_found",
            "message": "body.model is missing and this job runs several models; known: small, "
            "large",
            "line": 4,
        },
        "r5": {
            "code": "model_not_found",
            "message": "body.model 'medium' is no model of this job; known: small, large",
            "line": 6,
        },
    }
    # Model by model: the worker starts each model's engine once, small's (the first) first.
    assert r.stderr.count(STARTS) == 2, r.stderr
    assert "switching to model large" in r.stderr
    by_worker = [x for x in journal_records(job) if x["kind"] == "result"]
    assert [x["model"] for x in by_worker] == ["small", "small", "large", "large", "large"]
    manifest = json.loads((job / "manifest.json").read_text())
    assert [(m["name"], m["model"]) for m in manifest["engine"]["models"]] == [
        ("small", "org/small-model"),
        ("large", "org/large-model"),
    ]


def test_one_named_model_is_the_served_name_and_keeps_the_one_model_rules(
    tmp_path: Path,
) -> None:
    job = tmp_path / "job"
    r = _submit(_input(tmp_path, [None, None]), job, "--model", "mine=org/some-model")
    assert r.returncode == 0, r.stderr
    assert answer_models(job) == {"r0": "mine", "r1": "mine"}
    engine = json.loads((job / "manifest.json").read_text())["engine"]
    assert (engine["model"], engine["served_model_name"], engine["models"]) == (
        "org/some-model",
        "mine",
        [],
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--model", "a=x", "--model", "a=y"), "names the model 'a' twice"),
        (("--model", "=x", "--model", "b=y"), "gives a model no name: '=x'"),
        (("--model", "a=", "--model", "b=y"), "gives the model 'a' no path or hub id: 'a='"),
        (
            ("--model", "a=x", "--model", "org/plain"),
            "mixes a plain value with NAME=PATH values ('org/plain'); with several models "
            "give each as NAME=PATH",
        ),
    ],
)
def test_a_bad_named_model_is_a_usage_error_and_creates_nothing(
    tmp_path: Path, args: tuple[str, ...], message: str
) -> None:
    job = tmp_path / "job"
    r = _submit(_input(tmp_path, ["a"]), job, *args)
    assert r.returncode == 2, r.stderr
    assert f"Invalid value for '--model' (env var: 'BATCHRUN_MODEL'): {message}" in r.stderr
    assert "Traceback" not in r.stderr
    assert not job.exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("--served-model-name", "x"),
            "Invalid value for '--served-model-name': cannot be given with --model NAME=PATH "
            "(NAME is the name answers report)",
        ),
        (
            ("--tokenizer", "org/tok"),
            "Invalid value for '--tokenizer': applies to one model; leave it out with several "
            "--model",
        ),
    ],
)
def test_options_of_one_model_are_refused_with_several(
    tmp_path: Path, args: tuple[str, ...], message: str
) -> None:
    job = tmp_path / "job"
    r = _submit(_input(tmp_path, ["small"]), job, *TWO, *args)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr
    assert "Traceback" not in r.stderr
    assert not job.exists()


def _last(r: Any) -> str:
    assert "Traceback" not in r.stderr
    return [x for x in r.stderr.splitlines() if x.strip()][-1]


def test_status_counts_per_model(tmp_path: Path) -> None:
    job = tmp_path / "job"
    models = ["small", "large", "large", "small", "large"]
    # r3 (small) fails every attempt: counted under its model.
    r = _submit(
        _input(tmp_path, models),
        job,
        *TWO,
        "--max-attempts",
        "2",
        env={"BATCHRUN_ECHO_FAIL": "r3"},
    )
    assert r.returncode == 1, r.stderr
    # One pass per model plus each model's retry pass: small's retry runs before the switch.
    assert r.stderr.count(STARTS) == 2, r.stderr
    status = json.loads(cli("status", "--job-dir", str(job), "--json").stdout)
    for row in status["models"].values():  # its figures: tests/test_model_lanes.py
        rate = row.pop("completion_tokens_per_s")
        assert rate is None or rate > 0
    assert status["models"] == {
        "small": {
            "adapter_of": None,
            "requests": 2,
            "completed": 1,
            "failed": 1,
            "pending": 0,
            "tokens": {"prompt": 3, "completion": 3},
        },
        "large": {
            "adapter_of": None,
            "requests": 3,
            "completed": 3,
            "failed": 0,
            "pending": 0,
            "tokens": {"prompt": 9, "completion": 9},
        },
    }
    plain = cli("status", "--job-dir", str(job), env=WIDE).stdout
    table = plain[plain.index("models") :].split("└")[0].splitlines()
    rows = [" ".join(x.strip("│ ").split()) for x in table if x.startswith("│")]
    assert [x.rsplit(" │ ", 1)[0] for x in rows] == [
        "small │ 2 │ 1 │ 1 │ 0 │ 3/3",
        "large │ 3 │ 3 │ 0 │ 0 │ 9/9",
    ]


def test_a_one_model_status_has_one_entry_and_no_table(tmp_path: Path) -> None:
    job = tmp_path / "job"
    assert _submit(_input(tmp_path, ["x", "x"]), job).returncode == 0
    status = json.loads(cli("status", "--job-dir", str(job), "--json").stdout)
    assert list(status["models"]) == ["echo"]
    assert status["models"]["echo"]["completed"] == 2
    assert "models" not in cli("status", "--job-dir", str(job), env=WIDE).stdout


@pytest.mark.slow
def test_retry_failed_runs_each_models_failures_on_that_model(tmp_path: Path) -> None:
    job = tmp_path / "job"
    models = ["small", "large", "small", "large"]
    src = _input(tmp_path, models)
    r = _submit(src, job, *TWO, "--max-attempts", "1", env={"BATCHRUN_ECHO_FAIL": "r0,r1"})
    assert r.returncode == 1, r.stderr
    r = rerun("retry-failed", job)
    assert r.returncode == 0, r.stderr
    assert r.stderr.count(STARTS) == 2, r.stderr
    assert answer_models(job) == {"r0": "small", "r1": "large", "r2": "small", "r3": "large"}
    retried = [x for x in journal_records(job) if x["kind"] == "result" and x["attempt"] == 2]
    assert sorted((x["custom_id"], x["model"]) for x in retried) == [
        ("r0", "small"),
        ("r1", "large"),
    ]


@pytest.mark.slow
def test_an_adapter_runs_on_the_base_its_json_form_names(tmp_path: Path) -> None:
    adapter = make_adapter(tmp_path / "a1", seed=1)
    spec = json.dumps({"name": "a1", "path": str(adapter), "base_model_name": "large"})
    job = tmp_path / "job"
    models = ["a1", "small", "large", "a1"]
    r = _submit(_input(tmp_path, models), job, *TWO, "--lora-modules", spec)
    assert r.returncode == 0, r.stderr
    assert answer_models(job) == {"r0": "a1", "r1": "small", "r2": "large", "r3": "a1"}
    # small's pass first, then large's with its adapter's lines.
    order = [x["custom_id"] for x in journal_records(job) if x["kind"] == "result"]
    assert order[0] == "r1" and set(order[1:]) == {"r0", "r2", "r3"}
    manifest = json.loads((job / "manifest.json").read_text())
    assert manifest["model_requests"] == {"a1": 2, "small": 1, "large": 1}
    status = json.loads(cli("status", "--job-dir", str(job), "--json").stdout)
    assert status["models"]["a1"]["adapter_of"] == "large"
    assert status["models"]["a1"]["completed"] == 2


def test_an_adapter_of_a_model_the_job_does_not_run_is_refused(tmp_path: Path) -> None:
    adapter = make_adapter(tmp_path / "a1", seed=1)
    spec = json.dumps({"name": "a1", "path": str(adapter), "base_model_name": "huge"})
    job = tmp_path / "job"
    r = _submit(_input(tmp_path, ["small"]), job, *TWO, "--lora-modules", spec)
    assert r.returncode == 1, r.stderr
    assert _last(r) == (
        "error: adapter 'a1' is for the base model 'huge', but the job runs small, large"
    )
    assert not job.exists()


def test_resume_keeps_the_models_and_refuses_other_names(tmp_path: Path) -> None:
    job = tmp_path / "job"
    assert _submit(_input(tmp_path, ["small", "large"]), job, *TWO).returncode == 0
    r = cli("resume", "--job-dir", str(job), "--model", "x=a", "--model", "y=b", env=WIDE)
    assert r.returncode == 2, r.stderr
    assert (
        "Invalid value for '--model': cannot change a job's model names (its lines were "
        "checked against them): the job has small, large; give the same names, or submit a "
        "new job"
    ) in r.stderr
    r = cli("resume", "--job-dir", str(job), "--model", "org/plain", env=WIDE)
    assert r.returncode == 2, r.stderr
    assert (
        "Invalid value for '--model': the job runs several models (small, large); give each "
        "as NAME=PATH"
    ) in r.stderr


@pytest.mark.slow
def test_kill_9_mid_job_then_resume_answers_every_line_once_across_the_switch(
    tmp_path: Path,
) -> None:
    models = ["small", "large"]
    n = 160
    src = _input(tmp_path, [models[i % 2] for i in range(n)])
    job = tmp_path / "job"
    p = start_echo(src, job, *TWO, "--batch-size", "8", env={"BATCHRUN_ECHO_DELAY_MS": "40"})
    # Past small's 80 lines: the kill falls in large's pass, after the switch.
    kill_9_after(p, job, 100)
    before = journal_records(job)
    assert 100 <= len(before) < n
    assert {x["model"] for x in before[:80]} == {"small"}
    r = rerun("resume", job)
    assert r.returncode == 0, r.stderr
    # Only large has lines left: one engine start, no switch.
    assert r.stderr.count(STARTS) == 1, r.stderr
    ids = [x["custom_id"] for x in journal_records(job)]
    assert sorted(ids) == sorted(f"r{i}" for i in range(n))
    assert answer_models(job) == {f"r{i}": models[i % 2] for i in range(n)}


def test_known_models_route_adapters_to_their_base() -> None:
    known = KnownModels("small", ("a1", "a2"), others=("large",), adapter_bases=(("a2", "large"),))
    assert [known.base_of(n) for n in ("small", "large", "a1", "a2")] == [
        "small",
        "large",
        "small",
        "large",
    ]
    assert known.needs_name and None not in known and "large" in known
    assert known.adapter("a2") == "a2" and known.adapter("large") is None


@pytest.mark.slow
def test_serve_lists_the_base_model_and_each_adapter_with_its_parent(tmp_path: Path) -> None:
    import httpx
    from support.serving import API_KEY, start_server, stop_server

    adapter = make_adapter(tmp_path / "a1", seed=1)
    server = start_server(
        tmp_path / "root", "--model", "base=org/base-model", "--lora-modules", f"a1={adapter}"
    )
    try:
        headers = {"Authorization": f"Bearer {API_KEY}"}
        answer = httpx.get(f"{server.url}/v1/models", headers=headers, timeout=10)
        assert answer.status_code == 200
        listed = answer.json()
        # The openai package's own client reads it.
        assert [m.id for m in server.client().models.list()] == ["base", "a1"]
    finally:
        stop_server(server)
    assert listed["object"] == "list"
    created = listed["data"][0]["created"]
    assert isinstance(created, int)
    assert listed["data"] == [
        {
            "id": "base",
            "object": "model",
            "created": created,
            "owned_by": "batchrun",
            "root": "org/base-model",
            "parent": None,
        },
        {
            "id": "a1",
            "object": "model",
            "created": created,
            "owned_by": "batchrun",
            "root": str(adapter),
            "parent": "base",
        },
    ]


def test_identical_lines_for_two_models_are_not_merged(tmp_path: Path) -> None:
    lines = [model_line("r0", "small"), model_line("r1", "large"), model_line("r2", "large")]
    for line in lines:
        line["body"]["messages"][0]["content"] = "the same question"
        line["body"]["temperature"] = 0
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    job = tmp_path / "job"
    r = _submit(src, job, *TWO)
    assert r.returncode == 0, r.stderr
    assert answer_models(job) == {"r0": "small", "r1": "large", "r2": "large"}
    # Deduplication keys hold the model: only large's two lines are one request.
    copies = [x["custom_id"] for x in journal_records(job) if "copy_of" in x]
    assert copies == ["r2"]


def test_resume_takes_the_same_names_at_other_places(tmp_path: Path) -> None:
    job = tmp_path / "job"
    src = _input(tmp_path, ["small", "large"])
    r = _submit(src, job, *TWO, "--max-attempts", "1", env={"BATCHRUN_ECHO_FAIL": "r1"})
    assert r.returncode == 1, r.stderr
    moved = ("--model", "small=org/small-model", "--model", "large=org/moved-model")
    r = rerun("retry-failed", job, *moved)
    assert r.returncode == 0, r.stderr
    assert (
        "overrides: --model small=org/small-model,large=org/moved-model (was "
        "small=org/small-model,large=org/large-model)"
    ) in r.stderr
    engine = json.loads((job / "manifest.json").read_text())["engine"]
    assert [m["model"] for m in engine["models"]] == ["org/small-model", "org/moved-model"]


def test_resume_cannot_give_a_job_of_one_model_several(tmp_path: Path) -> None:
    job = tmp_path / "job"
    assert _submit(_input(tmp_path, [None]), job).returncode == 0
    r = cli("resume", "--job-dir", str(job), *TWO, env=WIDE)
    assert r.returncode == 2, r.stderr
    assert (
        "Invalid value for '--model': cannot give the job of one model (echo) several models: "
        "its lines were checked for one; submit a new job"
    ) in r.stderr
    assert json.loads((job / "manifest.json").read_text())["engine"]["models"] == []


def test_an_adapter_named_like_a_model_is_refused(tmp_path: Path) -> None:
    adapter = make_adapter(tmp_path / "a1", seed=1)
    job = tmp_path / "job"
    r = _submit(_input(tmp_path, ["small"]), job, *TWO, "--lora-modules", f"large={adapter}")
    assert r.returncode == 1, r.stderr
    assert _last(r) == (
        "error: adapter 'large' has the name of one of the job's models; give it another name"
    )
    assert not job.exists()
