"""The engine registry: every engine name means one entry, and an unknown one is refused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.fakes.gpus import gpu, install_nvidia_smi
from support.jobs import rerun, submit_echo
from support.lines import chat_line, write_jsonl
from support.paths import ROOT

from batchrun.config import EngineSettings, OptionError
from batchrun.engine_registry import (
    DEFAULT_ENGINE,
    ENGINE_NAMES,
    ENGINES,
    engine_help,
    engine_spec,
)
from batchrun.engines.base import create_engine
from batchrun.workers.devices import cache_device, worker_envs


def test_an_unknown_engine_is_refused_with_one_line() -> None:
    for name in ("gpt", "", "ECHO", None, 3):
        with pytest.raises(OptionError) as caught:
            engine_spec(name)
        assert caught.value.options == ("--engine",)
        assert str(caught.value) == f"must be one of vllm, echo, remote, got {name!r}"
        assert caught.value.exit_code == 2
    with pytest.raises(OptionError, match=r"^must be one of vllm, echo, remote, got 'gpt'$"):
        EngineSettings(engine="gpt").check()
    with pytest.raises(OptionError, match=r"^must be one of vllm, echo, remote, got 'gpt'$"):
        create_engine(EngineSettings(engine="gpt"))
    with pytest.raises(OptionError):
        worker_envs("gpt", None, 1, None)


def test_the_names_and_the_default() -> None:
    assert ENGINE_NAMES == ("vllm", "echo", "remote")
    assert DEFAULT_ENGINE == "vllm" == EngineSettings().engine
    assert engine_help() == (
        "vllm, echo (no model: replies with the input), or remote (an OpenAI-compatible server "
        "at --base-url)."
    )
    assert all(ENGINES[name].name == name for name in ENGINE_NAMES)


def test_every_entry_resolves_without_importing_vllm() -> None:
    """Each factory path names a class taking EngineSettings; resolving it (what a worker does
    before starting the engine) loads the engine's module, but neither vLLM nor torch."""
    code = (
        "import sys, inspect\n"
        "from batchrun.engine_registry import ENGINES\n"
        "from batchrun.workers.devices import cache_device\n"
        "for spec in ENGINES.values():\n"
        "    factory = spec.factory()\n"
        "    assert callable(factory), spec\n"
        "    assert list(inspect.signature(factory).parameters) == ['settings'], spec\n"
        "    assert spec.model in ('none', 'huggingface', 'remote'), spec\n"
        "    assert isinstance(spec.uses_gpus, bool), spec\n"
        "    assert isinstance(cache_device(spec), str) and cache_device(spec), spec\n"
        "assert 'vllm' not in sys.modules and 'torch' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_each_engine_s_properties(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A machine with four GPUs (a fake nvidia-smi), for the GPU layout below.
    for key, value in install_nvidia_smi(tmp_path, {"gpus": [gpu(i) for i in range(4)]}).items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    echo, vllm = engine_spec("echo"), engine_spec("vllm")
    assert (echo.model, echo.uses_gpus, cache_device(echo)) == ("none", False, "echo")
    assert (vllm.model, vllm.uses_gpus, vllm.cache_device) == ("huggingface", True, None)
    remote = engine_spec("remote")
    assert (remote.model, remote.uses_gpus, remote.flow_control) == ("remote", False, True)
    assert not echo.flow_control and not vllm.flow_control
    assert EngineSettings(engine="echo").spec is echo
    # Echo takes no GPU: `--workers` processes, whatever GPUs are named.
    assert worker_envs("echo", ["0", "1"], 1, None) == [{}]
    assert worker_envs("echo", ["0", "1"], 1, 3) == [{}, {}, {}]
    # vLLM is laid out over the GPUs: one worker per tensor-parallel group.
    envs = worker_envs("vllm", ["0", "1", "2", "3"], 2, None)
    order = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert envs == [
        {"CUDA_VISIBLE_DEVICES": "0,1", **order},
        {"CUDA_VISIBLE_DEVICES": "2,3", **order},
    ]


def test_the_echo_engine_starts_from_the_registry() -> None:
    engine = create_engine(EngineSettings(engine="echo"))
    try:
        assert not engine.has_unfinished()
    finally:
        engine.close()


def test_a_job_saved_with_an_unknown_engine_says_which_option_replaces_it(
    tmp_path: Path,
) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", [chat_line("a", "hi"), chat_line("b", "yo")])
    job = tmp_path / "job"
    r = submit_echo(src, job)
    assert r.returncode == 0, r.stdout + r.stderr
    manifest = json.loads((job / "manifest.json").read_text())
    manifest["engine"]["engine"] = "gpt"
    (job / "manifest.json").write_text(json.dumps(manifest))
    r = rerun("resume", job, env={"COLUMNS": "1000"})
    assert r.returncode == 1
    assert r.stderr == (
        "error: the job's saved --engine must be one of vllm, echo, remote, got 'gpt'; "
        "pass --engine to replace it\n"
    )
