"""A worker's environment fits its platform (workers/platform_env.py): on a GPU, vLLM's own engine
process and spawned ranks, its INFO log, no CPU tuning; on the CPU, the engine core in the
worker and vLLM's developer warnings kept out. Nothing in the worker asks torch.cuda whether
there is a GPU (that initialises CUDA, and vLLM then forks its ranks)."""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
from support.waits import wait_until

from batchrun.config import EngineSettings
from batchrun.workers import platform_env
from batchrun.workers.messages import Inbox
from batchrun.workers.platform_env import (
    apply_worker_environment,
    default_max_num_seqs,
    worker_environment,
    worker_platform,
)
from batchrun.workers.process import Worker

PARENT = {
    "PATH": "/usr/bin",
    "HF_HOME": "/models",
    "OMP_NUM_THREADS": "2",
    "VLLM_CPU_KVCACHE_SPACE": "4",
    "VLLM_CPU_OMP_THREADS_BIND": "0-1",
    "BATCHRUN_CPU_AFFINITY": "0,1",
}


def test_a_gpu_worker_gets_the_cuda_settings() -> None:
    env = worker_environment({"PATH": "/usr/bin"}, {"CUDA_VISIBLE_DEVICES": "0"})
    assert env == {
        "PATH": "/usr/bin",
        "CUDA_VISIBLE_DEVICES": "0",
        "VLLM_WORKER_MULTIPROC_METHOD": "spawn",
        "VLLM_LOGGING_LEVEL": "INFO",
        "PYTORCH_NVML_BASED_CUDA_CHECK": "1",
    }  # and VLLM_ENABLE_V1_MULTIPROCESSING left to vLLM (on)


def test_a_cpu_worker_gets_the_cpu_settings() -> None:
    own = {"OMP_NUM_THREADS": "1", "BATCHRUN_CPU_AFFINITY": "1"}
    env = worker_environment({"PATH": "/usr/bin", "VLLM_CPU_KVCACHE_SPACE": "4"}, own)
    assert env == {
        "PATH": "/usr/bin",
        "VLLM_CPU_KVCACHE_SPACE": "4",
        "OMP_NUM_THREADS": "1",
        "BATCHRUN_CPU_AFFINITY": "1",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_LOGGING_LEVEL": "ERROR",
    }


def test_the_parents_cpu_variables_never_reach_a_gpu_worker() -> None:
    env = worker_environment(PARENT, {"CUDA_VISIBLE_DEVICES": "GPU-4f1c,GPU-77aa"})
    assert env == {
        "PATH": "/usr/bin",
        "HF_HOME": "/models",
        "CUDA_VISIBLE_DEVICES": "GPU-4f1c,GPU-77aa",
        "VLLM_WORKER_MULTIPROC_METHOD": "spawn",
        "VLLM_LOGGING_LEVEL": "INFO",
        "PYTORCH_NVML_BASED_CUDA_CHECK": "1",
    }


def test_a_users_own_vllm_settings_win() -> None:
    parent = {"VLLM_LOGGING_LEVEL": "DEBUG", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    env = worker_environment(parent, {"CUDA_VISIBLE_DEVICES": "1"})
    assert env["VLLM_LOGGING_LEVEL"] == "DEBUG"
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"


@pytest.mark.parametrize(
    ("value", "platform"),
    [
        ("0", "cuda"),
        ("4,5", "cuda"),
        ("MIG-c6d4f1ef-1a2b-4c3d-9e8f-000000000000", "cuda"),
        ("", "cpu"),
        ("-1", "cpu"),
        ("NoDevFiles", "cpu"),
        (None, "cpu"),
    ],
)
def test_the_platform_is_read_from_the_workers_gpus(value: str | None, platform: str) -> None:
    env = {} if value is None else {"CUDA_VISIBLE_DEVICES": value}
    assert worker_platform(env) == platform


def test_applying_the_environment_removes_what_a_gpu_worker_must_not_have() -> None:
    environ = dict(PARENT)
    assert apply_worker_environment({"CUDA_VISIBLE_DEVICES": "0"}, environ) == "cuda"
    assert environ == worker_environment(PARENT, {"CUDA_VISIBLE_DEVICES": "0"})


def _rank_environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(e.decode().split("=", 1) for e in raw.split(b"\0") if b"=" in e)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")
def test_a_gpu_workers_processes_run_without_the_parents_cpu_tuning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real worker process given a GPU: what its engine's processes inherit (read from a rank's
    /proc/PID/environ) has the CUDA settings and none of the parent's CPU variables."""
    # Settings another test in this process may have left in os.environ (an in-process Ray
    # actor sets its log level) would count as the user's own, which win.
    for name in platform_env.platform_settings("cuda") | platform_env.platform_settings("cpu"):
        monkeypatch.delenv(name, raising=False)
    for name, value in PARENT.items():
        if name != "PATH":
            monkeypatch.setenv(name, value)
    pids = tmp_path / "ranks"
    monkeypatch.setenv("BATCHRUN_ECHO_SPAWN_RANKS", "1")
    monkeypatch.setenv("BATCHRUN_ECHO_RANK_PIDS", str(pids))
    worker = Worker(0, EngineSettings(engine="echo"), {"CUDA_VISIBLE_DEVICES": "0"})
    inbox: Inbox = queue.Queue()
    worker.start(inbox)
    try:
        wait_until(lambda: pids.exists() and pids.read_text().strip(), "the rank started", 60)
        rank = int(pids.read_text().split()[0])
        env = _rank_environ(rank)
    finally:
        worker.kill()
        for pid in pids.read_text().split() if pids.exists() else []:
            with contextlib.suppress(OSError):
                os.kill(int(pid), signal.SIGKILL)  # a rank the worker's group did not take along
    assert env["CUDA_VISIBLE_DEVICES"] == "0"
    assert env["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"
    assert env["VLLM_LOGGING_LEVEL"] == "INFO"
    assert env["PYTORCH_NVML_BASED_CUDA_CHECK"] == "1"
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in env
    leaked = sorted(n for n in env if platform_env.is_cpu_only(n))
    assert leaked == []


@pytest.mark.parametrize(
    ("memory_mib", "name", "seqs"),
    [
        (81559, "NVIDIA H100 80GB HBM3", 1024),
        (143771, "NVIDIA H200", 1024),
        (183359, "NVIDIA B200", 1024),
        (81920, "NVIDIA A100-SXM4-80GB", 256),
        (46068, "NVIDIA L40S", 256),
        (None, None, 256),
    ],
)
def test_the_concurrency_cap_is_vllms_own_default_for_the_gpu(
    memory_mib: int | None, name: str | None, seqs: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checked against vLLM's own rule as installed (EngineArgs.get_batch_defaults, for its LLM
    class), with its platform made to report that GPU."""
    from vllm.engine import arg_utils
    from vllm.usage.usage_lib import UsageContext

    class FakeGpu:
        def get_device_total_memory(self) -> int:
            if memory_mib is None:
                raise RuntimeError("no device")
            return memory_mib * 2**20

        def get_device_name(self) -> str:
            return name or ""

        def is_tpu(self) -> bool:
            return False

        def is_cpu(self) -> bool:
            return False

    monkeypatch.setattr(arg_utils, "current_platform", FakeGpu())
    _, vllm_seqs = arg_utils.EngineArgs.get_batch_defaults(world_size=1)
    assert vllm_seqs[UsageContext.LLM_CLASS] == seqs
    assert default_max_num_seqs(memory_mib, name) == seqs


def test_no_torch_cuda_probe_in_the_worker_or_the_engine_set_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """peak_memory_mb, the engine's arguments and its release never call
    torch.cuda.is_available() (it initialises CUDA in the worker). vLLM's own import does (Triton
    asks whether an AMD GPU is there), after setting PYTORCH_NVML_BASED_CUDA_CHECK itself."""
    import torch
    import vllm.engine.arg_utils  # noqa: F401  # imported first: its own import asks

    from batchrun.engines.vllm.args import engine_args
    from batchrun.engines.vllm.release import release_vllm_globals
    from batchrun.models import EngineModel
    from batchrun.workers.child import peak_memory_mb

    calls: list[str] = []

    def probe() -> bool:
        calls.append("is_available")
        return False

    monkeypatch.setattr(torch.cuda, "is_available", probe)
    assert peak_memory_mb() is not None
    args = engine_args(
        EngineSettings(engine="vllm", max_model_len=None),
        EngineModel(model="/nonexistent-model", tokenizer=None, revision=None),
        "m",
    )
    release_vllm_globals()
    assert calls == []
    # On this machine (vLLM's CPU build) vLLM's platform is the CPU: its settings apply.
    assert args.enforce_eager is True
    assert args.gpu_memory_utilization == 0.4


@pytest.mark.parametrize("cuda", [True, False])
@pytest.mark.slow
def test_vllms_own_engine_process_is_kept_on_a_gpu(
    cuda: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a GPU the engine leaves VLLM_ENABLE_V1_MULTIPROCESSING to vLLM (its engine-core process
    stays); on the CPU, the engine core runs in the worker. Both ask for vLLM's offline (LLM
    class) defaults for the device."""
    from vllm import LLMEngine
    from vllm.usage.usage_lib import UsageContext

    from batchrun.engines.vllm import engine as vllm_engine
    from batchrun.models import EngineModel

    seen: dict[str, Any] = {}

    class Started(Exception):
        pass

    def from_engine_args(args: Any, usage_context: Any = None, **kwargs: Any) -> Any:
        seen["usage_context"] = usage_context
        seen["multiprocessing"] = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
        raise Started

    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    monkeypatch.setattr(vllm_engine, "on_cuda", lambda: cuda)
    monkeypatch.setattr(vllm_engine, "engine_model", lambda *a, **k: EngineModel("/m", "/m", None))
    monkeypatch.setattr(vllm_engine, "engine_args", lambda *a, **k: object())
    monkeypatch.setattr(LLMEngine, "from_engine_args", from_engine_args)
    with pytest.raises(Started):
        vllm_engine.VllmEngine(EngineSettings(engine="vllm", model="/m"))
    if cuda:
        assert seen == {"usage_context": UsageContext.LLM_CLASS, "multiprocessing": None}
    else:
        assert seen == {"usage_context": UsageContext.LLM_CLASS, "multiprocessing": "0"}
