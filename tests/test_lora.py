"""LoRA adapters without a model: --lora-modules and its limits through the real CLI on the echo
engine (parsing, the adapter directory's checks, what is saved with the job, resume's checks),
the reader's routing of body.model, and the planner's grouping by adapter. The real engine's
answers: tests/vllm/test_lora_vllm.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support.cli import cli
from support.jobs import answer_models, rerun, start_echo, submit_echo
from support.lines import model_input, model_line, read_jsonl, write_jsonl
from support.processes import kill_9_after
from testmodels.lora import make_adapter

from batchrun.openai.reader import read_input
from batchrun.openai.records import CHAT, LineError, Request
from batchrun.openai.routing import KnownModels
from batchrun.run.planner import plan

# Usage errors in one line (rich boxes them at the terminal's width).
WIDE = {"COLUMNS": "1000"}


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two small adapters (rank 8) and one of rank 32."""
    tmp = tmp_path_factory.mktemp("adapters")
    return {
        "a1": make_adapter(tmp / "a1", seed=1),
        "a2": make_adapter(tmp / "a2", seed=2),
        "big": make_adapter(tmp / "big", seed=3, rank=32),
    }


def _mixed_input(tmp_path: Path) -> Path:
    models = [None, "a1", "echo", "a2", "nope", "a1", None, "a2"]
    return model_input(tmp_path / "in.jsonl", models)


def _submit(src: Path, job: Path, *args: str) -> Any:
    return submit_echo(src, job, *args, env=WIDE)


# The model that answers each line of _mixed_input: the name it asked for; no name, the base
# model's served name ("echo"); r4 names no model the job runs (an error record).
MIXED_MODELS = {
    "r0": "echo",
    "r1": "a1",
    "r2": "echo",
    "r3": "a2",
    "r5": "a1",
    "r6": "echo",
    "r7": "a2",
}


def _lora(adapters: dict[str, Path], *names: str) -> list[str]:
    return [a for n in names for a in ("--lora-modules", f"{n}={adapters[n]}")]


@pytest.mark.slow
def test_lines_pick_the_base_or_an_adapter_and_an_unknown_name_is_an_error_record(
    tmp_path: Path, adapters: dict[str, Path]
) -> None:
    job = tmp_path / "job"
    r = _submit(_mixed_input(tmp_path), job, *_lora(adapters, "a1", "a2"))
    assert r.returncode == 1, r.stderr  # the unknown name's line
    assert answer_models(job) == MIXED_MODELS
    [error] = read_jsonl(job / "errors.jsonl")
    assert error["custom_id"] == "r4"
    assert error["error"] == {
        "code": "model_not_found",
        "message": "body.model 'nope' is no model of this job; known: echo (the base model), "
        "a1, a2",
        "line": 5,
    }
    manifest = json.loads((job / "manifest.json").read_text())
    saved = manifest["engine"]["lora_modules"]
    assert [(a["name"], a["path"]) for a in saved] == [
        ("a1", str(adapters["a1"])),
        ("a2", str(adapters["a2"])),
    ]
    assert all(len(a["fingerprint"]) == 64 for a in saved)


def test_without_adapters_a_file_still_names_one_model(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", [model_line("a", "m1"), model_line("b", "m2")])
    items = list(read_input(src))
    assert isinstance(items[0], Request)
    assert isinstance(items[1], LineError) and items[1].code == "mixed_models"


def test_the_reader_with_adapters_takes_the_base_and_adapter_names(tmp_path: Path) -> None:
    src = write_jsonl(
        tmp_path / "in.jsonl",
        [
            model_line("a", "base"),
            model_line("b", "a1"),
            model_line("c", None),
            model_line("d", "other"),
        ],
    )
    items = list(read_input(src, KnownModels("base", ("a1",))))
    assert [type(i).__name__ for i in items] == ["Request", "Request", "Request", "LineError"]
    error = items[3]
    assert isinstance(error, LineError)
    assert (error.code, error.line, error.message) == (
        "model_not_found",
        4,
        "body.model 'other' is no model of this job; known: base (the base model), a1",
    )


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("a1", "takes NAME=PATH (or JSON with name and path), got 'a1'"),
        ("=/tmp/x", "gives an adapter no name: '=/tmp/x'"),
        ("a1=", "gives the adapter 'a1' no path: 'a1='"),
        ('{"name": "a1"', "is not valid JSON"),
        ('{"name": "a1", "path": "/x", "rank": 8}', "takes JSON of the form"),
    ],
)
def test_a_malformed_lora_module_is_a_usage_error(tmp_path: Path, value: str, message: str) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", [model_line("a", None)])
    r = _submit(src, tmp_path / "job", "--lora-modules", value)
    assert r.returncode == 2, r.stderr
    assert (
        f"Invalid value for '--lora-modules' (env var: 'BATCHRUN_LORA_MODULES'): {message}"
        in r.stderr
    )
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "job").exists()


@pytest.mark.slow
def test_an_adapter_named_twice_is_a_usage_error(tmp_path: Path, adapters: dict[str, Path]) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", [model_line("a", None)])
    r = _submit(
        src,
        tmp_path / "job",
        "--lora-modules",
        f"a1={adapters['a1']}",
        "--lora-modules",
        f"a1={adapters['a2']}",
    )
    assert r.returncode == 2, r.stderr
    assert "names the adapter 'a1' twice" in r.stderr


def _refusal(r: Any) -> str:
    assert "Traceback" not in r.stderr
    lines: list[str] = [x for x in r.stderr.splitlines() if x.strip()]
    return lines[-1]


def test_bad_adapter_directories_are_refused_before_a_job_exists(
    tmp_path: Path, adapters: dict[str, Path]
) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", [model_line("a", None)])
    job = tmp_path / "job"
    missing = tmp_path / "missing"
    empty = tmp_path / "empty"
    empty.mkdir()
    no_weights = tmp_path / "no-weights"
    no_weights.mkdir()
    (no_weights / "adapter_config.json").write_text("{}")
    cases = [
        (["--lora-modules", f"x={missing}"], f"error: adapter 'x': {missing} does not exist"),
        (
            ["--lora-modules", f"x={empty}"],
            f"error: adapter 'x': {empty} has no adapter_config.json (not a LoRA adapter "
            "directory)",
        ),
        (
            ["--lora-modules", f"x={no_weights}"],
            f"error: adapter 'x': {no_weights} has no weights (adapter_model.safetensors or "
            "adapter_model.bin or adapter_model.pt)",
        ),
        (
            _lora(adapters, "big"),
            f"error: adapter 'big' ({adapters['big']}) has rank 32, above --max-lora-rank 16; "
            "pass --max-lora-rank 32",
        ),
        (
            [
                "--lora-modules",
                json.dumps({"name": "x", "path": str(adapters["a1"]), "base_model_name": "other"}),
            ],
            "error: adapter 'x' is for the base model 'other', but the job runs 'echo'",
        ),
    ]
    for args, message in cases:
        r = _submit(src, job, *args)
        assert r.returncode == 1, r.stderr
        assert _refusal(r) == message
        assert not job.exists()
    # The rank limit raised: accepted.
    r = _submit(src, job, *_lora(adapters, "big"), "--max-lora-rank", "32")
    assert r.returncode == 0, r.stderr


def test_a_max_lora_rank_vllm_does_not_take_is_a_usage_error(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", [model_line("a", None)])
    r = _submit(src, tmp_path / "job", "--max-lora-rank", "12")
    assert r.returncode == 2, r.stderr
    assert "must be one of 1, 8, 16, 32, 64, 128, 256, 320, 512, got 12" in r.stderr


def test_resume_refuses_a_changed_or_missing_adapter_and_other_names(
    tmp_path: Path, adapters: dict[str, Path]
) -> None:
    own = make_adapter(tmp_path / "own", seed=5)
    src = write_jsonl(tmp_path / "in.jsonl", [model_line("a", "own"), model_line("b", None)])
    job = tmp_path / "job"
    r = _submit(src, job, "--lora-modules", f"own={own}", "--max-attempts", "1")
    assert r.returncode == 0, r.stderr
    # Nothing is left to run, but the checks come first: a resume runs with the same adapters.
    weights = own / "adapter_model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    r = rerun("resume", job)
    assert r.returncode == 1
    assert _refusal(r) == (
        f"error: adapter 'own': the files in {own} changed since the job was submitted; "
        "restore them, or submit a new job"
    )
    weights.write_bytes(data)
    moved = tmp_path / "moved"
    own.rename(moved)
    r = rerun("resume", job)
    assert r.returncode == 1
    assert _refusal(r) == f"error: adapter 'own': {own} does not exist"
    # The same adapter at its new place: accepted (the same files).
    r = rerun("resume", job, "--lora-modules", f"own={moved}")
    assert r.returncode == 0, r.stderr
    # Another name: the job's lines were checked against its names.
    r = rerun("resume", job, "--lora-modules", f"a1={adapters['a1']}", env=WIDE)
    assert r.returncode == 2, r.stderr
    assert (
        "cannot change a job's adapter names (its lines were checked against them): the job "
        "has own; give the same names, or submit a new job"
    ) in r.stderr


def _request(cid: str, model: str | None, text: str = "") -> Request:
    body: dict[str, Any] = {"messages": [{"role": "user", "content": text or cid}]}
    if model is not None:
        body["model"] = model
    return Request(cid, 1, CHAT, body)


def test_the_plan_groups_lines_by_adapter_in_the_order_they_first_appear() -> None:
    models = [None, "a1", "a2", None, "a1", "a3", "a2", None, "a3", "a1"]
    requests = [_request(f"r{i}", m) for i, m in enumerate(models)]
    planned = list(plan(iter(requests), "auto"))
    order = [r.body.get("model") for r in planned]
    # Each adapter's lines together: the engine swaps to each adapter once.
    assert order == [None] * 3 + ["a1"] * 3 + ["a2"] * 2 + ["a3"] * 2
    assert sorted(r.custom_id for r in planned) == sorted(r.custom_id for r in requests)
    # --order input: the file's order, as asked.
    assert [r.custom_id for r in plan(iter(requests), "input")] == [r.custom_id for r in requests]


def test_prefix_groups_still_form_within_an_adapter() -> None:
    doc = "A long shared document. " * 20
    requests = [
        _request("x0", "a1", "alone one"),
        _request("d0", "a1", doc + "q0"),
        _request("y0", "a2", doc + "q9"),
        _request("x1", "a1", "alone two"),
        _request("d1", "a1", doc + "q1"),
    ]
    planned = [r.custom_id for r in plan(iter(requests), "auto")]
    # a1's shared-document pair first (a group), then its lone lines in file order; then a2.
    assert planned == ["d0", "d1", "x0", "x1", "y0"]


@pytest.mark.slow
def test_serve_routes_a_batchs_lines_to_the_base_or_its_adapter(
    tmp_path: Path, adapters: dict[str, Path]
) -> None:
    from support.serving import create_batch, lines_of, start_server, stop_server, wait_done

    server = start_server(tmp_path / "root", *_lora(adapters, "a1", "a2"))
    try:
        client = server.client()
        batch = wait_done(client, create_batch(client, _mixed_input(tmp_path)).id)
        assert batch.status == "completed"
        models = {
            o["custom_id"]: o["response"]["body"]["model"]
            for o in lines_of(client, batch.output_file_id)
        }
        assert models == MIXED_MODELS
        [error] = lines_of(client, batch.error_file_id)
        assert (error["custom_id"], error["error"]["code"]) == ("r4", "model_not_found")
    finally:
        stop_server(server)


def test_serve_refuses_a_missing_adapter_in_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    r = cli(
        "serve", "--root", str(tmp_path / "root"), "--engine", "echo", "--lora-modules",
        f"x={missing}", env=WIDE,
    )  # fmt: skip
    assert r.returncode == 1, r.stderr
    assert _refusal(r) == f"error: adapter 'x': {missing} does not exist"


@pytest.mark.slow
def test_kill_9_mid_job_then_resume_runs_each_adapter_line_exactly_once(
    tmp_path: Path, adapters: dict[str, Path]
) -> None:

    from support.jobs import journal_records

    models = [None, "a1", "a2", "echo"]
    src = write_jsonl(
        tmp_path / "in.jsonl", [model_line(f"r{i}", models[i % 4]) for i in range(200)]
    )
    job = tmp_path / "job"
    p = start_echo(
        src,
        job,
        *_lora(adapters, "a1", "a2"),
        "--batch-size",
        "8",
        env={"BATCHRUN_ECHO_DELAY_MS": "50"},
    )
    kill_9_after(p, job, 40)
    before = len(journal_records(job))
    assert 40 <= before < 200
    # The resume reads the input with the job's adapters: its adapter lines run, none twice.
    r = rerun("resume", job)
    assert r.returncode == 0, r.stderr
    ids = [x["custom_id"] for x in journal_records(job)]
    assert sorted(ids) == sorted(f"r{i}" for i in range(200))
    assert answer_models(job) == {f"r{i}": models[i % 4] or "echo" for i in range(200)}


def test_an_adapter_of_another_base_model_is_refused_before_a_job_exists(
    tmp_path: Path, adapters: dict[str, Path]
) -> None:
    # A model directory with SmolLM2's shapes (its config.json is all the check reads).
    model = tmp_path / "smol"
    model.mkdir()
    config = {
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_attention_heads": 9,
        "head_dim": 64,
        "num_hidden_layers": 30,
    }
    (model / "config.json").write_text(json.dumps(config))
    other = make_adapter(tmp_path / "other", seed=4, hidden=1024)
    src = write_jsonl(tmp_path / "in.jsonl", [model_line("a", None)])
    job = tmp_path / "job"
    r = cli(
        "submit", str(src), "--job-dir", str(job), "--model", str(model),
        "--lora-modules", f"other={other}", "--no-progress",
    )  # fmt: skip
    assert r.returncode == 1, r.stderr
    assert _refusal(r) == (
        "error: adapter 'other' does not fit the base model smol: "
        "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight takes inputs of size "
        "1024, the model's hidden size is 576 (an adapter of another model?)"
    )
    assert not job.exists()
    # Fewer layers than the adapter has: refused too.
    (model / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 12}))
    r = cli(
        "submit",
        str(src),
        "--job-dir",
        str(job),
        "--model",
        str(model),
        *_lora(adapters, "a1"),
        "--no-progress",
    )
    assert r.returncode == 1, r.stderr
    assert _refusal(r) == (
        "error: adapter 'a1' does not fit the base model smol: it has weights for layer 12, "
        "the model has 12 layers (an adapter of another model?)"
    )


def test_an_adapter_named_like_the_base_model_is_refused_by_submit_resume_and_serve(
    tmp_path: Path, adapters: dict[str, Path]
) -> None:
    """Served names are one namespace: `smol` the base and `smol` an adapter would answer a line
    naming smol with the adapter, where the docs say the base's name means the base."""
    clash = "error: adapter 'smol' has the name of the job's base model; give it another name"
    src = write_jsonl(tmp_path / "in.jsonl", [model_line("a", "smol"), model_line("b", None)])
    job = tmp_path / "job"
    r = _submit(src, job, "--served-model-name", "smol", "--lora-modules", f"smol={adapters['a1']}")
    assert r.returncode == 1, r.stderr
    assert _refusal(r) == clash
    assert not job.exists()
    # The JSON form, and the base's name when --served-model-name is left out (echo's: "echo").
    as_json = json.dumps({"name": "echo", "path": str(adapters["a1"])})
    r = _submit(src, job, "--lora-modules", as_json)
    assert r.returncode == 1, r.stderr
    assert _refusal(r) == clash.replace("'smol'", "'echo'")
    assert not job.exists()
    # resume: the adapter given again under a job's base name (here the base renamed onto it).
    r = _submit(src, job, "--served-model-name", "smol", "--lora-modules", f"a1={adapters['a1']}")
    assert r.returncode == 0, r.stderr
    before = (job / "manifest.json").read_text()
    lora = f"a1={adapters['a1']}"
    r = rerun("resume", job, "--served-model-name", "a1", "--lora-modules", lora, env=WIDE)
    assert r.returncode == 1, r.stderr
    assert _refusal(r) == clash.replace("'smol'", "'a1'")
    assert (job / "manifest.json").read_text() == before
    root = tmp_path / "root"
    r = cli(
        "serve", "--root", str(root), "--engine", "echo", "--served-model-name", "smol",
        "--lora-modules", f"smol={adapters['a1']}", env=WIDE,
    )  # fmt: skip
    assert r.returncode == 1, r.stderr
    assert _refusal(r) == clash
    assert not root.exists()
