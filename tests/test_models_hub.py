"""--model as vLLM takes it (a hub id, a directory, a .gguf file), --revision, --tokenizer,
--served-model-name, the job keeping them for resume, the environment Ray actors get, and the
OpenAI Batch API endpoints no local text model serves. No engine starts here: the hub id on the
real engine is the shared chat job's (tests/support/vllm_jobs.py, tests/vllm/test_vllm_e2e.py)."""

from __future__ import annotations

import json
import os
import queue
from pathlib import Path
from typing import Any

import pytest
from support.cli import cli, cli_process
from support.hub_cache import COMMIT, HUB_ID, make_hub_cache
from support.jobs import rerun
from support.lines import chat_line, read_jsonl, write_jsonl

from batchrun import cache_home, models
from batchrun.config import EngineSettings
from batchrun.errors import BatchrunError
from batchrun.openai.invalid import InvalidLine
from batchrun.openai.records import SUPPORTED_ENDPOINTS
from batchrun.openai.validation import check_url
from batchrun.workers.ray import actor_env

ENDPOINTS = ", ".join(repr(u) for u in SUPPORTED_ENDPOINTS)


@pytest.fixture()
def model_dir(tmp_path: Path) -> Path:
    """A model directory with the files a hub snapshot holds (no weights: nothing loads it)."""
    d = tmp_path / "src-model"
    d.mkdir()
    (d / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}', encoding="utf-8")
    (d / "tokenizer_config.json").write_text("{}", encoding="utf-8")
    return d


@pytest.fixture()
def hf_home(tmp_path: Path, model_dir: Path) -> Path:
    """A hub cache holding HUB_ID at COMMIT, with refs/main pointing at it."""
    home = tmp_path / "hf"
    make_hub_cache(home, model_dir)
    return home


@pytest.fixture()
def offline_hub(monkeypatch: pytest.MonkeyPatch, hf_home: Path) -> Path:
    """huggingface_hub, in this process, reading that cache in offline mode."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hf_home / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return hf_home


def offline_env(home: Path) -> dict[str, str]:
    return {"HF_HOME": str(home), "HF_HUB_OFFLINE": "1"}


# -- what a --model value is ----------------------------------------------------------------------


def test_model_kinds_are_told_apart_as_vllm_does(tmp_path: Path, model_dir: Path) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF\x03\x00")
    assert models.model_kind(None) == "default"
    assert models.model_kind(str(model_dir)) == "directory"
    assert models.model_kind(str(gguf)) == "gguf"
    assert models.model_kind(HUB_ID) == "hub"
    assert models.model_kind("gpt2") == "hub"  # a hub id without an organisation


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            "{tmp}/none",
            "--model {tmp}/none: not a directory, a .gguf file or a Hugging Face hub id (no such "
            "path, and not of the form ORG/NAME)",
        ),
        ("{tmp}/none.gguf", "--model {tmp}/none.gguf: no such file"),
        (
            "{tmp}/in.jsonl",
            "--model {tmp}/in.jsonl: a file, but not a .gguf file (expected a Hugging Face model "
            "directory, a .gguf file or a Hugging Face hub id)",
        ),
    ],
)
def test_a_model_that_is_nothing_vllm_loads_is_refused(
    tmp_path: Path, value: str, message: str
) -> None:
    (tmp_path / "in.jsonl").write_text("{}\n", encoding="utf-8")
    with pytest.raises(BatchrunError) as e:
        models.model_kind(value.format(tmp=tmp_path))
    assert str(e.value) == message.format(tmp=tmp_path)


def test_a_gguf_file_must_be_one(tmp_path: Path) -> None:
    fake = tmp_path / "fake.gguf"
    fake.write_text("not a model", encoding="utf-8")
    with pytest.raises(BatchrunError) as e:
        models.check_gguf(str(fake))
    assert str(e.value) == f"--model {fake}: not a GGUF file (it does not start with 'GGUF')"


# -- hub ids in the cache ------------------------------------------------------------------------


def test_a_hub_id_resolves_offline_from_the_cache(offline_hub: Path) -> None:
    found = models.resolve_hub(HUB_ID, None)
    assert found.commit == COMMIT
    assert (
        found.path
        == offline_hub / "hub/models--HuggingFaceTB--SmolLM2-135M-Instruct/snapshots" / COMMIT
    )
    assert models.resolve_hub(HUB_ID, COMMIT).commit == COMMIT  # a commit as the revision
    assert models.resolve_hub(HUB_ID, "main").commit == COMMIT  # a branch, through refs/main


def test_offline_and_not_cached_names_the_id_and_where_it_looked(offline_hub: Path) -> None:
    with pytest.raises(BatchrunError) as e:
        models.resolve_hub("Org/Missing", None)
    assert str(e.value) == (
        f"--model Org/Missing: not in the Hugging Face cache at {offline_hub / 'hub'} (set by "
        "HF_HOME or HF_HUB_CACHE), and HF_HUB_OFFLINE is set, so it cannot be downloaded; "
        "download it first (hf download Org/Missing) or unset HF_HUB_OFFLINE"
    )
    with pytest.raises(BatchrunError) as e:
        models.resolve_hub(HUB_ID, "v2")  # cached, but not at that revision
    assert str(e.value).startswith(f"--model {HUB_ID} at revision v2: not in the Hugging Face")


def test_a_cached_repo_without_config_is_no_model(offline_hub: Path, tmp_path: Path) -> None:
    only_gguf = tmp_path / "gguf-repo"
    only_gguf.mkdir()
    (only_gguf / "model.Q4.gguf").write_bytes(b"GGUF")
    make_hub_cache(offline_hub, only_gguf, repo_id="Org/Only-GGUF")
    with pytest.raises(BatchrunError) as e:
        models.resolve_hub("Org/Only-GGUF", None)
    assert str(e.value) == (
        "--model Org/Only-GGUF: the repository has no config.json (a GGUF-only repository? "
        "download its .gguf file and pass its path, with --tokenizer naming the base model)"
    )


def test_the_tokenizer_may_be_a_directory_or_a_cached_hub_id(
    offline_hub: Path, model_dir: Path
) -> None:
    assert models.check_tokenizer(str(model_dir)) == str(model_dir.resolve())
    assert models.check_tokenizer(HUB_ID) == HUB_ID
    with pytest.raises(BatchrunError) as e:
        models.check_tokenizer("Org/Missing")
    assert str(e.value).startswith("--tokenizer Org/Missing: not in the Hugging Face cache at ")


# -- what the engine hands vLLM ------------------------------------------------------------------


def test_vllm_gets_the_hub_id_at_the_commit_found(offline_hub: Path) -> None:
    got = models.engine_model(HUB_ID, revision=COMMIT)
    assert got == models.EngineModel(model=HUB_ID, tokenizer=None, revision=COMMIT)
    got = models.engine_model(HUB_ID, tokenizer="Org/Tok", revision=COMMIT)
    assert got.tokenizer == "Org/Tok"


def test_vllm_gets_a_directory_with_its_own_tokenizer_unless_one_is_named(
    model_dir: Path,
) -> None:
    got = models.engine_model(str(model_dir))
    assert got == models.EngineModel(str(model_dir), str(model_dir), None)
    assert models.engine_model(str(model_dir), tokenizer="Org/Tok").tokenizer == "Org/Tok"


def test_a_gguf_file_is_converted_once_and_again_when_it_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The conversion itself (transformers, 30 s) is the default model's, run by the vLLM jobs;
    # here: where it goes, that it runs once, and that a replaced file is converted again.
    converted: list[Path] = []

    def convert(gguf: Path, out: Path) -> None:
        converted.append(gguf)
        (out / "config.json").write_text("{}", encoding="utf-8")

    monkeypatch.setattr(models.convert, "_convert", convert)
    gguf = tmp_path / "My-Model.Q4_K_M.gguf"
    gguf.write_bytes(b"GGUF" + b"\0" * 16)
    assert not models.gguf_model_ready(gguf)
    got = models.engine_model(str(gguf))
    target = Path(got.model)
    assert target.parent == cache_home.cache_root() / "models" / "gguf"
    assert target.name.startswith("My-Model.Q4_K_M-")
    assert got.tokenizer == got.model  # the GGUF's own tokenizer, converted with it
    assert (target / "config.json").is_file() and models.gguf_model_ready(gguf)
    assert models.engine_model(str(gguf), tokenizer="Org/Base").tokenizer == "Org/Base"
    assert converted == [gguf.resolve()]
    gguf.write_bytes(b"GGUF" + b"\1" * 32)  # replaced in place
    models.engine_model(str(gguf))
    assert converted == [gguf.resolve()] * 2


def test_engine_settings_keep_the_model_fields_and_read_old_jobs() -> None:
    s = EngineSettings(
        model=HUB_ID,
        revision="v1",
        tokenizer="Org/Tok",
        served_model_name="mine",
        model_commit=COMMIT,
    )
    assert EngineSettings.from_dict(json.loads(json.dumps(s.to_dict()))) == s
    old = {"engine": "vllm", "model": "/m", "model_name": "m"}  # a job from an older batchrun
    assert EngineSettings.from_dict(old).revision is None


# -- through the CLI (real subprocesses; each fails or ends before an engine starts) ----------


MODERATION = {
    "custom_id": "m",
    "method": "POST",
    "url": "/v1/moderations",
    "body": {"model": "omni-moderation-latest", "input": "hi"},
}


def invalid_only(tmp_path: Path) -> Path:
    """An input whose lines are all invalid: the job is made, and no engine ever starts."""
    return write_jsonl(tmp_path / "bad.jsonl", [MODERATION, '{"custom_id": "x"'])


def test_offline_and_not_cached_is_one_line_and_no_job(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", [chat_line("a", "hi")])
    job = tmp_path / "j"
    empty = tmp_path / "empty-hf"
    r = cli_process(  # a process: huggingface_hub reads HF_HOME and HF_HUB_OFFLINE at import
        "submit", str(src), "--job-dir", str(job), "--model", "Org/Missing", env=offline_env(empty)
    )
    assert r.returncode == 1
    assert r.stderr.splitlines() == [  # no "job dir:" line: no job was made
        f"error: --model Org/Missing: not in the Hugging Face cache at {empty / 'hub'} (set by "
        "HF_HOME or HF_HUB_CACHE), and HF_HUB_OFFLINE is set, so it cannot be downloaded; "
        "download it first (hf download Org/Missing) or unset HF_HUB_OFFLINE",
    ]
    assert not job.exists()


def test_revision_is_for_hub_ids_only(tmp_path: Path, model_dir: Path) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", [chat_line("a", "hi")])
    args = ("submit", str(src), "--job-dir", str(tmp_path / "j"))
    r = cli(*args, "--model", str(model_dir), "--revision", "v1")
    assert r.returncode == 2
    assert "Invalid value for '--revision': applies to a Hugging Face hub id only" in r.stderr
    r = cli(*args, "--served-model-name", " ")
    assert r.returncode == 2 and "must not be empty" in r.stderr


def test_a_job_keeps_the_hub_id_and_resume_resolves_it_again(tmp_path: Path, hf_home: Path) -> None:
    job = tmp_path / "j"
    # Processes: huggingface_hub reads HF_HOME and HF_HUB_OFFLINE when it is imported.
    r = cli_process(
        "submit", str(invalid_only(tmp_path)), "--job-dir", str(job), "--model", HUB_ID,
        "--no-progress", env=offline_env(hf_home),
    )  # fmt: skip
    assert r.returncode == 1, r.stderr  # 1: its lines are invalid
    assert "starting vllm engine" not in r.stderr
    manifest = json.loads((job / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["model"] == HUB_ID  # the name answers report without --served-model-name
    engine = manifest["engine"]
    assert (engine["model"], engine["revision"], engine["model_commit"]) == (HUB_ID, None, COMMIT)
    # The moderation line's error record says why it cannot run.
    assert cli("export", "--job-dir", str(job)).returncode == 0
    errors = {e["error"]["line"]: e["error"] for e in read_jsonl(job / "errors.jsonl")}
    assert errors[1] == {
        "code": "invalid_url",
        "message": "url '/v1/moderations' is an OpenAI Batch API endpoint that batchrun cannot "
        "serve: it needs a moderation classifier, and batchrun runs local chat, embedding and "
        f"speech-to-text models; supported are {ENDPOINTS}",
        "line": 1,
    }

    # The cache gone (another machine, a cleaned cache): resume looks again, and says so.
    empty = tmp_path / "empty-hf"
    r = rerun("resume", job, env=offline_env(empty), process=True)
    assert r.returncode == 1
    assert r.stderr.splitlines() == [
        f"error: --model {HUB_ID}: not in the Hugging Face cache at {empty / 'hub'} (set by "
        "HF_HOME or HF_HUB_CACHE), and HF_HUB_OFFLINE is set, so it cannot be downloaded; "
        f"download it first (hf download {HUB_ID}) or unset HF_HUB_OFFLINE"
    ]

    # Back in the cache: found again. Every line of this job is invalid, so nothing runs and a
    # name given to report is not saved (the job keeps the options its results came from).
    r = rerun("resume", job, "--served-model-name", "smol", env=offline_env(hf_home), process=True)
    assert r.returncode == 1, r.stderr
    assert r.stderr.splitlines() == ["nothing to run: the options given were not saved"]
    manifest = json.loads((job / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["model"] == HUB_ID
    assert manifest["engine"]["served_model_name"] is None


def test_served_model_name_is_what_answers_report(tmp_path: Path) -> None:
    line = chat_line("a", "hi")
    del line["body"]["model"]  # a request that names no model gets the served name
    src = write_jsonl(tmp_path / "in.jsonl", [line])
    job = tmp_path / "j"
    args = ("--engine", "echo", "--no-progress")
    r = cli("submit", str(src), "--job-dir", str(job), "--served-model-name", "my-model", *args)
    assert r.returncode == 0, r.stderr
    assert cli("export", "--job-dir", str(job)).returncode == 0
    assert [o["response"]["body"]["model"] for o in read_jsonl(job / "output.jsonl")] == [
        "my-model"
    ]
    saved = json.loads((job / "manifest.json").read_text(encoding="utf-8"))
    assert (saved["model"], saved["engine"]["served_model_name"]) == ("my-model", "my-model")


# -- Ray actors get the model's environment ---------------------------------------------------


def test_actor_env_takes_the_model_and_engine_variables_only() -> None:
    model = {
        "HF_HOME": "/data/hf",
        "HF_TOKEN": "hf_x",
        "HF_HUB_OFFLINE": "1",
        "HF_HUB_CACHE": "/data/hf/hub",
        "HUGGING_FACE_HUB_TOKEN": "hf_y",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_LOGGING_LEVEL": "DEBUG",
        "BATCHRUN_HOME": "/data/batchrun",
    }
    environ = {
        **model,
        # Per node or per local worker: never copied to another node.
        "VLLM_HOST_IP": "10.0.0.1",
        "BATCHRUN_WORKER_LOG": "/j/logs/worker-0.log",
        "BATCHRUN_CPU_AFFINITY": "1",
        # Nothing the model needs.
        "PATH": "/usr/bin",
        "HOME": "/root",
        "CUDA_VISIBLE_DEVICES": "0",
        "XHF_HOME": "no",
    }
    assert actor_env(environ) == model


@pytest.mark.ray
def test_an_actor_gets_the_variables_its_node_never_had(monkeypatch: pytest.MonkeyPatch) -> None:
    # A local Ray instance's actors inherit the environment its raylet started with, as an
    # actor on another node has that node's: a variable set after ray.init reaches the actor
    # only through the runtime_env batchrun passes.
    ray = pytest.importorskip("ray")
    from batchrun.workers.messages import Inbox, Ready
    from batchrun.workers.ray import RayWorker

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    worker = RayWorker(index=0, settings=EngineSettings(engine="echo"), env={})
    try:
        monkeypatch.setenv("HF_HOME", "/nowhere/hf-home")
        monkeypatch.setenv("VLLM_SOMETHING", "on")
        monkeypatch.setenv("UNRELATED_VARIABLE", "x")
        inbox: Inbox = queue.Queue()
        worker.start(inbox)
        assert isinstance(inbox.get(timeout=120)[2], Ready)

        def seen(actor: object) -> list[str | None]:
            return [os.environ.get(k) for k in ("HF_HOME", "VLLM_SOMETHING", "UNRELATED_VARIABLE")]

        assert ray.get(worker.process.__ray_call__.remote(seen)) == ["/nowhere/hf-home", "on", None]
    finally:
        worker.stop()
        ray.shutdown()


# -- endpoints a local text model cannot serve --------------------------------------------------


@pytest.mark.parametrize(
    ("url", "needs"),
    [
        ("/v1/moderations", "a moderation classifier"),
        ("/v1/images/generations", "an image generation model"),
        ("/v1/images/edits", "an image generation model"),
        ("/v1/videos", "a video generation model"),
        ("/v1/audio/speech", "a speech synthesis model"),
    ],
)
def test_openai_endpoints_no_local_text_model_serves_say_why(url: str, needs: str) -> None:
    with pytest.raises(InvalidLine) as e:
        check_url({"url": url})
    assert (e.value.code, str(e.value)) == (
        "invalid_url",
        f"url {url!r} is an OpenAI Batch API endpoint that batchrun cannot serve: it needs "
        f"{needs}, and batchrun runs local chat, embedding and speech-to-text models; "
        f"supported are {ENDPOINTS}",
    )


def test_other_unknown_urls_keep_the_plain_message() -> None:
    with pytest.raises(InvalidLine) as e:
        check_url({"url": "/v1/imagesx"})
    assert str(e.value) == f"url must be one of {ENDPOINTS}, got '/v1/imagesx'"


def test_the_echo_engine_reports_the_served_name_else_the_model_as_named(tmp_path: Path) -> None:
    from batchrun.run.model_prep import prepare_model

    def named(**fields: Any) -> str:
        settings = EngineSettings(engine="echo", **fields)
        prepare_model(settings, lambda line: None)
        return settings.model_name

    assert named() == "echo"
    assert named(model=HUB_ID) == HUB_ID  # no model loads: a hub id is not looked up
    assert named(model=str(tmp_path)) == tmp_path.name
    assert named(model=HUB_ID, served_model_name="mine") == "mine"
